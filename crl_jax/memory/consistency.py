"""Whether a restored bank is one the run could have written: its device arrays and its text store
describe the same entries, and every counter is in range.

A checkpoint's manifest catches changed bytes; this catches the rest (a step written by another
tool, an edited host state, a bank saved under other tasks), before the run trusts the bank.
"""

from __future__ import annotations

import numpy as np

from crl_jax.memory.bank import NEVER, Bank
from crl_jax.memory.text_store import TextStore


def bank_problem(bank: Bank, store: TextStore, tasks: list[str], capacity: int, dim: int) -> str | None:
    """What is wrong with (bank, store) for a run of `tasks`, or None."""
    b = {name: np.asarray(getattr(bank, name)) for name in (
        "keys", "valid", "entry_id", "retrieval_count", "train_count", "next_id")}
    if b["valid"].shape != (len(tasks), capacity) or b["keys"].shape[2:] != (dim,):
        return (f"bank arrays of shape {b['valid'].shape} x {b['keys'].shape[2:]}, expected "
                f"{(len(tasks), capacity)} x {(dim,)}")
    valid = b["valid"].astype(bool)
    ids = b["entry_id"][valid]
    if len(set(ids.tolist())) != len(ids):
        return "the bank holds one entry id in two slots"
    if (ids < 0).any() or (ids >= int(b["next_id"])).any():
        return f"bank entry ids outside [0, next id {int(b['next_id'])})"
    if (b["entry_id"][~valid] != NEVER).any():
        return "an empty bank slot carries an entry id"
    if not np.isfinite(b["keys"][valid]).all():
        return "a bank key holds a NaN or infinity"
    if (b["retrieval_count"][valid] < 0).any() or (b["train_count"][valid] < 0).any():
        return "a negative retrieval or training count"
    if set(ids.tolist()) != store.ids():
        missing, extra = set(ids.tolist()) - store.ids(), store.ids() - set(ids.tolist())
        return (f"the bank and its text disagree: {len(missing)} entries without text, "
                f"{len(extra)} texts without an entry")
    rows, _ = np.nonzero(valid)
    for row, entry_id in zip(rows.tolist(), ids.tolist()):
        if store[entry_id].task != tasks[row]:
            return f"entry {entry_id} of task {store[entry_id].task!r} sits in the {tasks[row]!r} partition"
    return None
