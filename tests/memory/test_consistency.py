"""A restored bank is checked against its text store: each kind of disagreement is named."""

import dataclasses

import numpy as np
import pytest

from crl_jax.memory.bank import NEVER, init_bank
from crl_jax.memory.consistency import bank_problem
from crl_jax.memory.text_store import Entry, TextStore

TASKS = ["a/v1", "b/v1"]


def two_entries():
    """Entry 0 of task a in slot (0, 0), entry 1 of task b in slot (1, 2), next id 2."""
    bank = init_bank(len(TASKS), 4, 3)
    valid = np.zeros((2, 4), bool)
    valid[0, 0] = valid[1, 2] = True
    ids = np.full((2, 4), NEVER, np.int32)
    ids[0, 0], ids[1, 2] = 0, 1
    bank = dataclasses.replace(bank, valid=valid, entry_id=ids, next_id=np.int32(2),
                               keys=np.ones((2, 4, 3), np.float32))
    store = TextStore([Entry(0, "a/v1", "t", "c", "q", 0), Entry(1, "b/v1", "t", "c", "q", 0)])
    return bank, store


def test_a_bank_the_run_wrote_passes():
    assert bank_problem(*two_entries(), TASKS, 4, 3) is None


def _with(bank, **fields):
    arrays = {k: np.array(getattr(bank, k)) for k in fields}
    for k, edit in fields.items():
        edit(arrays[k])
    return dataclasses.replace(bank, **arrays)


def _set(index, value):
    def edit(a):
        a[index] = value
    return edit


@pytest.mark.parametrize("edit, expected", [
    ({"entry_id": _set((1, 2), 0)}, "one entry id in two slots"),
    ({"entry_id": _set((1, 2), 5)}, "outside [0, next id 2)"),
    ({"entry_id": _set((0, 3), 1)}, "an empty bank slot carries an entry id"),
    ({"keys": _set((0, 0, 1), np.nan)}, "NaN"),
    ({"retrieval_count": _set((1, 2), -3)}, "negative"),
    ({"valid": _set((1, 2), False), "entry_id": _set((1, 2), NEVER)}, "1 texts without an entry"),
])
def test_each_disagreement_is_named(edit, expected):
    bank, store = two_entries()
    assert expected in bank_problem(_with(bank, **edit), store, TASKS, 4, 3)


def test_an_entry_in_another_tasks_partition_and_a_bank_of_another_shape():
    bank, store = two_entries()
    assert "entry 1 of task 'b/v1' sits in the 'c/v1' partition" in bank_problem(bank, store, ["a/v1", "c/v1"], 4, 3)
    assert "expected (2, 8)" in bank_problem(bank, store, TASKS, 8, 3)
    assert "expected (2, 4) x (5,)" in bank_problem(bank, store, TASKS, 4, 5)
