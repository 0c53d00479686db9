"""Search and diversity re-rank against a brute-force numpy reference; sharded equals unsharded."""
import functools

import jax
import numpy as np
import pytest

from crl_jax import sharding
from crl_jax.memory import bank as bk
from crl_jax.memory.search import (TOP_K_BLOCK, SearchConfig, masked_top_k, search,
                                   top_k_by_blocks, top_k_in_bounding_blocks)


def random_bank(rng, num_tasks, capacity, dim, fill):
    keys = rng.normal(size=(num_tasks, capacity, dim)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    valid = rng.random((num_tasks, capacity)) < fill
    ids = np.where(valid, rng.permutation(num_tasks * capacity).reshape(num_tasks, capacity), -1)
    last = np.where(rng.random(valid.shape) < 0.3, rng.integers(0, 10, valid.shape), -1)
    count = np.where(last >= 0, rng.integers(1, 20, valid.shape), 0)
    b = bk.init_bank(num_tasks, capacity, dim)
    return b.replace(keys=keys, valid=valid, entry_id=ids.astype(np.int32),
                     retrieval_count=count.astype(np.int32), last_retrieved_step=last.astype(np.int32),
                     next_id=np.int32(num_tasks * capacity))


def reference(b, queries, task_ids, step, draws, cfg):
    """Plain numpy: exact similarity order, Eq. 6 score, demotion, top-k."""
    out = []
    for q, t, demote_draw in zip(queries, task_ids, draws):
        slots = np.nonzero(b.valid[t])[0]
        sims = b.keys[t, slots] @ q
        cand = slots[np.lexsort((slots, -sims))][:cfg.num_candidates]      # ties: lower slot
        last = b.last_retrieved_step[t, cand]
        recent = (last >= 0) & (step - last < cfg.recency_window)
        score = -np.arange(len(cand)) - cfg.count_penalty * np.log1p(b.retrieval_count[t, cand]) \
            - cfg.recency_penalty * recent
        order = list(np.argsort(-score, kind="stable"))
        if demote_draw and len(order) > 1 and recent[order[0]]:
            order = order[1:] + order[:1]
        out.append([int(b.entry_id[t, cand[i]]) for i in order[:cfg.k]] + [-1] * (cfg.k - len(order[:cfg.k])))
    return np.array(out)


@pytest.mark.parametrize("k,demote,fill", [(1, 0.5, 0.9), (3, 1.0, 0.5), (2, 0.0, 0.02), (1, 1.0, 0.3)])
def test_search_matches_numpy_reference(k, demote, fill):
    rng = np.random.default_rng(k * 10 + int(demote * 4))
    b = random_bank(rng, 3, 200, 8, fill)
    cfg = SearchConfig(k=k, candidate_multiplier=4, count_penalty=0.4, recency_window=3,
                       demote_prob=demote)
    queries = rng.normal(size=(24, 8)).astype(np.float32)
    task_ids = rng.integers(0, 3, 24).astype(np.int32)
    key, step = jax.random.key(3), 9
    got = jax.jit(functools.partial(search, cfg=cfg))(b, queries, task_ids, key, step)
    draws = np.asarray(jax.random.uniform(key, (24,)) < demote)
    want = reference(jax.device_get(b), queries, task_ids, step, draws, cfg)
    np.testing.assert_array_equal(np.asarray(got.entry_ids), want)
    b_np = jax.device_get(b)
    for r, (t, q) in enumerate(zip(task_ids, queries)):
        for i, sim in zip(np.asarray(got.entry_ids[r]), np.asarray(got.similarity[r])):
            if i >= 0:
                slot = np.nonzero(b_np.entry_id[t] == i)[0][0]
                np.testing.assert_allclose(sim, b_np.keys[t, slot] @ q, rtol=1e-5, atol=1e-6)
    # The re-rank matters on these banks: plain nearest-neighbour order differs somewhere.
    if fill > 0.1:
        plain = reference(jax.device_get(b), queries, task_ids, step, np.zeros(24, bool),
                          SearchConfig(k=k, candidate_multiplier=1, count_penalty=0, recency_penalty=0))
        assert (plain != want).any()


@pytest.mark.parametrize("values", ["normal", "few_distinct", "mostly_empty"])
@pytest.mark.parametrize("m,k,block", [(96, 3, 4), (1001, 5, 8), (5000, 16, 16)])
def test_top_k_by_blocks_equals_top_k(values, m, k, block):
    rng = np.random.default_rng(m + k)
    x = rng.normal(size=(6, m)).astype(np.float32)
    if values == "few_distinct":      # ties everywhere: the lower index must win, as in top_k
        x = rng.integers(0, 4, (6, m)).astype(np.float32)
    if values == "mostly_empty":      # fewer live entries than k in some rows
        x[rng.random((6, m)) < 0.995] = -np.inf
    want = jax.lax.top_k(x, k)
    got = jax.jit(top_k_by_blocks, static_argnums=(1, 2))(x, k, block)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def masked_rows(case, rng, m=5000):
    """Scores [6, m] of rows in two partitions, and the partitions' live slots [2, m]."""
    x = rng.normal(size=(6, m)).astype(np.float32)
    valid = rng.random((2, m)) < 0.9
    rows = np.array([0, 1, 0, 1, 1, 0], np.int32)
    if case == "all_live":
        valid[:] = True
    if case == "dead_score_zero":      # free slots' keys are zero (`bank.delete` zeroes them)
        x = np.where(valid[rows], x, 0.0).astype(np.float32)
    if case == "dead_score_highest":   # deleted entries' keys outscore every live one
        x[:, ~valid[0] & ~valid[1]] += 10.0
    if case == "ties":
        x = rng.integers(0, 4, (6, m)).astype(np.float32)
    if case == "mostly_empty":         # fewer live entries than k in some rows
        valid = rng.random((2, m)) < 0.002
    return x, valid, rows


@pytest.mark.parametrize("case", ["all_live", "some_dead", "dead_score_zero",
                                  "dead_score_highest", "ties", "mostly_empty"])
def test_masked_top_k_equals_top_k_of_the_masked_scores(case):
    x, valid, rows = masked_rows(case, np.random.default_rng(3))
    want = jax.lax.top_k(np.where(valid[rows], x, -np.inf), 16)
    got = jax.jit(masked_top_k, static_argnums=(3, 4))(x.T, valid, rows, 16, 16)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("case,proven", [("all_live", True), ("dead_score_zero", True),
                                         ("dead_score_highest", False), ("ties", False)])
def test_the_unmasked_shortcut_is_taken_only_where_it_proves_its_answer(case, proven):
    """Both branches of `masked_top_k` run in the test above: the shortcut where live slots
    hold the top (free slots scoring 0, as zeroed keys do, included), the masked fallback where
    dead slots outscore them or ties blur the bound."""
    x, valid, rows = masked_rows(case, np.random.default_rng(3))
    values, index, exact = jax.jit(top_k_in_bounding_blocks, static_argnums=(3, 4))(
        x.T, valid, rows, 16, 16)
    assert bool(exact) == proven
    if proven:
        want = jax.lax.top_k(np.where(valid[rows], x, -np.inf), 16)
        np.testing.assert_array_equal(np.asarray(index), np.asarray(want[1]))


@pytest.mark.parametrize("distinct_keys", [None, 30])
def test_long_partitions_match_numpy_reference(distinct_keys):
    """Partitions long enough for the two-pass top-k, with and without repeated keys (ties)."""
    rng = np.random.default_rng(4)
    capacity, cfg = 6000, SearchConfig(k=1, candidate_multiplier=4, recency_window=3)
    assert capacity >= 8 * cfg.num_candidates * TOP_K_BLOCK
    b = random_bank(rng, 2, capacity, 8, 0.8)
    if distinct_keys:
        b = b.replace(keys=b.keys[:, rng.integers(0, distinct_keys, capacity)])
    queries = rng.normal(size=(16, 8)).astype(np.float32)
    task_ids = rng.integers(0, 2, 16).astype(np.int32)
    key, step = jax.random.key(1), 9
    got = jax.jit(functools.partial(search, cfg=cfg))(b, queries, task_ids, key, step)
    draws = np.asarray(jax.random.uniform(key, (16,)) < cfg.demote_prob)
    want = reference(jax.device_get(b), queries, task_ids, step, draws, cfg)
    np.testing.assert_array_equal(np.asarray(got.entry_ids), want)


def test_similarity_and_empty_partition():
    rng = np.random.default_rng(0)
    b = random_bank(rng, 2, 50, 8, 0.5)
    valid, ids = b.valid.copy(), b.entry_id.copy()
    valid[1], ids[1] = False, -1
    b = b.replace(valid=valid, entry_id=ids)
    queries = rng.normal(size=(4, 8)).astype(np.float32)
    find = jax.jit(functools.partial(search, cfg=SearchConfig(k=2, demote_prob=0)))
    res = find(b, queries, np.array([0, 1, 0, 1]), jax.random.key(0), 0)
    assert (np.asarray(res.entry_ids)[[1, 3]] == -1).all() and np.isinf(res.similarity[1]).all()
    b_np = jax.device_get(b)
    for r in (0, 2):
        for i, sim in zip(np.asarray(res.entry_ids[r]), np.asarray(res.similarity[r])):
            slot = np.nonzero(b_np.entry_id[0] == i)[0][0]
            np.testing.assert_allclose(sim, b_np.keys[0, slot] @ queries[r], rtol=1e-5)


def test_sharded_search_equals_unsharded():
    assert jax.device_count() == 8
    rng = np.random.default_rng(1)
    b = random_bank(rng, 2, 8 * 40, 16, 0.7)
    cfg = SearchConfig(k=2, candidate_multiplier=8, demote_prob=0.5, recency_window=5)
    queries = rng.normal(size=(16, 16)).astype(np.float32)
    task_ids = rng.integers(0, 2, 16).astype(np.int32)
    key = jax.random.key(7)
    plain = jax.jit(functools.partial(search, cfg=cfg))(b, queries, task_ids, key, 8)
    mesh = sharding.make_mesh()
    shardings = sharding.tree_shardings(mesh, b, bk.bank_logical_axes())
    sharded_bank = jax.device_put(b, shardings)
    assert sharded_bank.keys.sharding.spec[1] == "fsdp"
    assert len(sharded_bank.keys.addressable_shards) == 8
    sharded = jax.jit(functools.partial(search, cfg=cfg, mesh=mesh))(sharded_bank, queries, task_ids, key, 8)
    np.testing.assert_array_equal(np.asarray(sharded.entry_ids), np.asarray(plain.entry_ids))
    np.testing.assert_allclose(np.asarray(sharded.similarity), np.asarray(plain.similarity), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(sharded.score), np.asarray(plain.score))


def test_bad_inputs_are_clear():
    b = bk.init_bank(2, 8, 4)
    with pytest.raises(ValueError, match="queries must be"):
        search(b, np.zeros((3, 5)), np.zeros(3, np.int32), jax.random.key(0), 0, cfg=SearchConfig())
    with pytest.raises(ValueError, match="task_ids must be in"):
        search(b, np.zeros((2, 4)), np.array([0, 2]), jax.random.key(0), 0, cfg=SearchConfig())
    with pytest.raises(ValueError, match="demote_prob"):
        SearchConfig(demote_prob=2)


def test_sharded_bank_updates_equal_unsharded():
    rng = np.random.default_rng(2)
    b = random_bank(rng, 2, 8 * 4, 16, 0.9)
    mesh = sharding.make_mesh()
    sharded = jax.device_put(b, sharding.tree_shardings(mesh, b, bk.bank_logical_axes()))
    keys = rng.normal(size=(6, 16)).astype(np.float32)
    tasks = np.array([0, 1, 0, 0, 1, 0], np.int32)
    change = jax.jit(bk.apply_changes)
    doomed = np.array([int(b.entry_id[0][b.valid[0]][0]), -1], np.int32)
    want = jax.device_get(change(b, doomed, keys, tasks, 11))
    got = change(sharded, doomed, keys, tasks, 11)
    assert got[0].keys.sharding.spec[1] == "fsdp", "the bank stays sharded through updates"
    for x, y in zip(jax.tree.leaves(jax.device_get(got)), jax.tree.leaves(want)):
        np.testing.assert_array_equal(x, y)
