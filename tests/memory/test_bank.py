"""Bank bookkeeping: property tests over random sequences of add / update / delete / eviction,
checked against a plain-Python FIFO model, with arrays and text store kept in step."""
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crl_jax.memory import bank as bk
from crl_jax.memory.manager import MemoryConfig, MemoryManager

TASKS = ("a", "b")
CAPACITY = 4

op_strategy = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(TASKS), st.integers(1, 3)),
    st.tuples(st.just("update"), st.sampled_from(TASKS), st.lists(st.integers(0, 9), max_size=3)),
    st.tuples(st.just("delete"), st.sampled_from(TASKS), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
)


def _check(mgr, model):
    b = jax.device_get(mgr.bank)
    assert b.valid.sum() == sum(len(v) for v in model.values())
    for p, task in enumerate(TASKS):
        assert b.valid[p].sum() <= CAPACITY
        ids = b.entry_id[p][b.valid[p]]
        assert sorted(ids) == sorted(model[task]), "bank holds exactly the FIFO model's entries"
        assert (b.entry_id[p][~b.valid[p]] == bk.NEVER).all()
        assert not b.keys[p][~b.valid[p]].any(), "a free slot's key is zero (deleted or unused)"
    live = b.entry_id[b.valid]
    assert len(set(live.tolist())) == len(live), "entry ids unique"
    assert mgr.store.ids() == set(live.tolist()), "every valid slot has its text, and only those"
    for e in mgr.store:
        assert e.entry_id in model[e.task]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(op_strategy, min_size=1, max_size=25))
def test_any_sequence_keeps_invariants(bank_fns, hash_embed, sequence):
    mgr = MemoryManager(MemoryConfig(tasks=TASKS, capacity=CAPACITY, dim=16), bank_fns, hash_embed)
    model = {t: [] for t in TASKS}          # live ids per task, oldest first
    next_id = 0

    def model_add(task):
        nonlocal next_id
        if len(model[task]) == CAPACITY:
            model[task].pop(0)               # FIFO: the oldest entry goes
        model[task].append(next_id)
        next_id += 1

    for step, (kind, task, arg) in enumerate(sequence):
        if kind == "add":
            body = "\n".join(f"add(<title>t{i}</title><content>c{step}</content>)" for i in range(arg))
            reason, ids = mgr.distill(task, f"q{step}", f"<answer>{body}</answer>", [], step)
            assert reason == "ok" and len(ids) == min(arg, CAPACITY)
            for _ in range(arg):
                model_add(task)
        elif kind == "update":
            shown = [model[task][i % len(model[task])] for i in arg] if model[task] else []
            shown = list(dict.fromkeys(shown))
            text = f"<answer>update([{', '.join(str(i + 1) for i in range(len(shown)))}], " \
                   f"<title>u</title><content>merged {step}</content>)</answer>"
            reason, ids = mgr.distill(task, f"q{step}", text, shown, step)
            if shown:
                assert reason == "ok" and len(ids) == 1
                for i in shown:
                    model[task].remove(i)
                model_add(task)
            else:
                assert reason == "bad_index" and ids == []
        else:
            ids = [model[task][i % len(model[task])] for i in arg] if model[task] else []
            assert mgr.delete_entries(ids, step) == len(set(ids))
            for i in set(ids):
                model[task].remove(i)
        _check(mgr, model)
    assert int(mgr.bank.next_id) == next_id


add, delete, update = jax.jit(bk.add), jax.jit(bk.delete), jax.jit(bk.update)


def test_fifo_evicts_oldest_and_reuses_freed_slots():
    b = bk.init_bank(1, 3, 2)
    keys = np.eye(2, dtype=np.float32)[[0, 1, 0]]
    b, ids, ev = add(b, keys, np.zeros(3, np.int32), 0)
    assert ids.tolist() == [0, 1, 2] and ev.tolist() == [-1, -1, -1]
    b, n = delete(b, np.array([1, 7, -1]))               # unknown and padding ids ignored
    assert int(n) == 1
    b, ids, ev = add(b, keys[:2], np.zeros(2, np.int32), 1, mask=np.array([True, True]))
    assert ids.tolist() == [3, 4] and ev.tolist() == [-1, 0], "freed slot first, then the oldest"
    b, new_id, evicted = update(b, np.array([2]), keys[0], 0, 2)
    assert int(new_id) == 5 and int(evicted) == -1
    assert sorted(np.asarray(b.entry_id[0]).tolist()) == [3, 4, 5]
    b, ids, ev = add(b, keys[:2], np.zeros(2, np.int32), 3, mask=np.array([False, True]))
    assert ids.tolist() == [-1, 6] and ev.tolist() == [-1, 3], "masked rows change nothing"


def test_counters_and_train_weights():
    b = bk.init_bank(2, 4, 2)
    weights = jax.jit(bk.train_weights, static_argnames=("cooldown", "power"))
    b, ids, _ = add(b, np.ones((3, 2), np.float32), np.array([0, 0, 1]), 0)
    b = jax.jit(bk.mark_retrieved)(b, np.array([[0, 0], [2, -1]]), 5)   # entry 0 shown to two rollouts
    row = {int(i): (int(c), int(s)) for i, c, s in zip(np.ravel(b.entry_id), np.ravel(b.retrieval_count),
                                                      np.ravel(b.last_retrieved_step)) if i >= 0}
    assert row == {0: (2, 5), 1: (0, -1), 2: (1, 5)}
    b = jax.jit(bk.mark_trained)(b, np.array([0, 0, 1]), 7)
    w = weights(b, np.array([0, 1, 2]), 8, cooldown=1, power=0.5)
    np.testing.assert_allclose(w, [3.0 ** -0.5, 2.0 ** -0.5, 1.0], rtol=1e-6)
    w = weights(b, np.array([0, 2]), 7, cooldown=1, power=0.5)
    np.testing.assert_allclose(w, [0.0, 1.0])               # trained this very step: cooling down
    assert np.asarray(b.task_id).tolist()[1][:2] == [1, -1]


def test_bad_sizes_are_clear():
    with pytest.raises(ValueError, match="num_tasks"):
        bk.init_bank(0, 4, 2)
