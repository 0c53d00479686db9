"""Bank search: exact top-k by inner product inside a task partition, then the diversity re-rank.

Retrieval follows the paper's Appendix B: take an oversampled candidate set (k times
`candidate_multiplier`) by similarity, score each candidate by
    s(m) = -rank(m) - lambda * log(1 + c(m)) - recency_penalty * 1[recent(m)]
(rank 0 = most similar, c(m) = times shown to the actor, recent = shown within `recency_window`
steps), keep the best k. The released code adds a random demotion: with probability
`demote_prob`, a re-ranked top-1 that was itself shown recently moves behind every other valid
candidate. Rank ties keep similarity order; every step is deterministic given the PRNG key.

With a mesh, the slot axis stays sharded: each device takes its local top candidates and only
those (B x C per device) are gathered and merged, never the full score matrix. A single device is
the same code with one shard, so both paths give identical results.

Legend: B queries, P task partitions, M slots per partition (m per device), E embedding,
C candidates (k * candidate_multiplier), k results.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, PartitionSpec

from crl_jax import sharding
from crl_jax.memory.bank import NEVER, Bank, apply_changes, mark_retrieved, mark_trained


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    k: int = 1                     # entries returned per query (released config: 1)
    candidate_multiplier: int = 16
    count_penalty: float = 0.4     # lambda
    recency_window: int = 1        # steps; 1 = "already shown at this step"
    recency_penalty: float = 1.0
    demote_prob: float = 0.5

    def __post_init__(self):
        problems = [f"{name} must be >= {lo}, got {getattr(self, name)}" for name, lo in
                    (("k", 1), ("candidate_multiplier", 1), ("count_penalty", 0),
                     ("recency_window", 0), ("recency_penalty", 0)) if getattr(self, name) < lo]
        if not 0.0 <= self.demote_prob <= 1.0:
            problems.append(f"demote_prob must be in [0, 1], got {self.demote_prob}")
        if problems:
            raise ValueError("invalid SearchConfig: " + "; ".join(problems))

    @property
    def num_candidates(self) -> int:
        return self.k * self.candidate_multiplier


@struct.dataclass
class SearchResult:
    entry_ids: jax.Array   # [B, k] int32, NEVER where the partition had fewer than k entries
    similarity: jax.Array  # [B, k] float32 inner product of query and key (-inf where empty)
    score: jax.Array       # [B, k] float32 re-rank score s(m) (-inf where empty)


def _local_candidates(keys, valid, entry_id, count, last, slot_index, queries, task_ids, c):
    """Top-`c` candidates of each query among this shard's slots of its own partition."""
    p, m, e = keys.shape
    # Scores slot-major, [P*m, E] x [B, E]^T: with the bank as the left operand XLA:CPU streams
    # it through the product about 10% faster than with the queries there (the three-operand
    # einsum is several times slower still: it copies the keys transposed).
    sims = jax.lax.dot_general(keys.reshape(p * m, e), queries, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32).reshape(p, m, -1)
    if p > 1:
        sims = jnp.take_along_axis(sims, jnp.broadcast_to(task_ids, (1, m, task_ids.shape[0])),
                                   axis=0)
    sims = sims[0]                                                           # [m, B]
    sim, idx = masked_top_k(sims, valid, task_ids, min(c, m))               # [B, c]
    rows = task_ids[:, None]
    live = sim > -jnp.inf
    return (sim, jnp.where(live, entry_id[rows, idx], NEVER), count[rows, idx], last[rows, idx],
            slot_index[idx])


TOP_K_BLOCK = 128


def _blocks_pay(m: int, k: int, block: int) -> bool:
    """Whether a row of `m` is long enough for the two passes over blocks to beat one top-k."""
    return m >= 8 * k * block


def top_k_by_blocks(x, k: int, block: int = TOP_K_BLOCK):
    """`jax.lax.top_k(x, k)` along the last axis, same values and indices (ties: lower index), in
    two cheap passes when the axis is long: the best `k` blocks by their maxima hold the best `k`
    entries (an entry outside them is beaten by k block maxima), so one max-reduction over `x` and
    a top-k over `k * block` gathered entries replace XLA:CPU's top-k over the whole axis, which
    sorts far more than it keeps."""
    *lead, m = x.shape
    if not _blocks_pay(m, k, block):
        return jax.lax.top_k(x, k)
    num_blocks = -(-m // block)
    # A strided window rather than a reshape: XLA:CPU slows the reduction several times over
    # when it follows a pad or a slice that makes the axis a multiple of `block`.
    block_max = jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1,) * len(lead) + (block,), (1,) * len(lead) + (block,),
        [(0, 0)] * len(lead) + [(0, num_blocks * block - m)])
    _, best_blocks = jax.lax.top_k(block_max, k)
    # Blocks in slot order, so that the final top-k's lower-position tie-break is lower slot.
    best_blocks = jnp.sort(best_blocks, axis=-1)
    index = (best_blocks[..., None] * block + jnp.arange(block)).reshape(*lead, k * block)
    gathered = jnp.where(index < m, jnp.take_along_axis(x, jnp.minimum(index, m - 1), axis=-1),
                         -jnp.inf)
    values, pos = jax.lax.top_k(gathered, k)
    return values, jnp.take_along_axis(index, pos, axis=-1)


def masked_top_k(x, valid, rows, k: int, block: int = TOP_K_BLOCK):
    """`jax.lax.top_k(where(valid[rows], x.T, -inf), k)` for scores `x` [m, B] (slot-major, as
    the product writes them), `valid` [P, m] and `rows` [B]: each query's best `k` slots, same
    values and indices, without writing the masked copy of `x` when it can: that copy is a pass
    over the whole score matrix. Where the shortcut cannot prove its answer (see
    `top_k_in_bounding_blocks`), the masked two-pass top-k runs instead."""
    masked = lambda: jnp.where(valid[rows], x.T, -jnp.inf)  # noqa: E731
    if not _blocks_pay(x.shape[0], k, block):
        return jax.lax.top_k(masked(), k)
    values, index, exact = top_k_in_bounding_blocks(x, valid, rows, k, block)
    return jax.lax.cond(exact, lambda: (values, index), lambda: top_k_by_blocks(masked(), k, block))


def top_k_in_bounding_blocks(x, valid, rows, k: int, block: int = TOP_K_BLOCK):
    """`(values, indices, exact)` for scores `x` [m, B]: each query's masked top `k` among its
    best `k` blocks of `block` slots by their unmasked maxima, and whether that is its masked top
    `k` of all `m` slots.

    An unmasked block maximum bounds the masked one from above, so the answer is exact when, in
    every query, the `k`-th value found beats every other block's bound strictly (strictly, so
    that ties still go to the lower index). It fails where masked-out slots (a deleted entry's
    key, an empty slot) outscore the live entries."""
    m, b = x.shape
    num_blocks = -(-m // block)
    # Maxima down the slot axis: each window reads contiguous rows of B scores.
    bound = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (block, 1), (block, 1),
                                  [(0, num_blocks * block - m), (0, 0)]).T     # [B, blocks]
    _, best_blocks = jax.lax.top_k(bound, k)
    # Not top_k(bound, k + 1): XLA:CPU sorts the whole row for most k.
    other_bound = jnp.max(bound.at[jnp.arange(b)[:, None], best_blocks].set(-jnp.inf), axis=-1)
    index = (jnp.sort(best_blocks, axis=-1)[..., None] * block
             + jnp.arange(block)).reshape(b, k * block)
    inside = jnp.minimum(index, m - 1)
    live = (index < m) & valid[rows[:, None], inside]
    values, pos = jax.lax.top_k(
        jnp.where(live, x[inside, jnp.arange(b)[:, None]], -jnp.inf), k)
    # min, not values[:, k - 1]: XLA:CPU then keeps its top-k kernel instead of a full sort.
    exact = jnp.all(jnp.min(values, axis=-1) > other_bound)
    return values, jnp.take_along_axis(index, pos, axis=-1), exact


def _merge(cands, c):
    """Best `c` of candidate lists concatenated along axis 1 in slot order (ties: lower slot)."""
    sim, idx = jax.lax.top_k(cands[0], min(c, cands[0].shape[1]))
    return (sim,) + tuple(jnp.take_along_axis(x, idx, axis=1) for x in cands[1:])


def candidates(bank: Bank, queries, task_ids, cfg: SearchConfig, mesh: Mesh | None = None):
    """`(similarity, entry_id, retrieval_count, last_retrieved_step, slot)`, each [B, C], in
    descending similarity order."""
    c = cfg.num_candidates
    slot_index = jnp.arange(bank.capacity, dtype=jnp.int32)
    args = (bank.keys, bank.valid, bank.entry_id, bank.retrieval_count, bank.last_retrieved_step,
            slot_index, queries, task_ids)
    spec = sharding.logical_to_spec((None, "memory_slots"), mesh, bank.valid.shape) if mesh else None
    slot_axes = () if spec is None or spec[1] is None else (
        (spec[1],) if isinstance(spec[1], str) else tuple(spec[1]))
    if not slot_axes:
        return _merge(_local_candidates(*args, c), c)

    def per_shard(*a):
        local = _local_candidates(*a, c)
        gathered = tuple(jax.lax.all_gather(x, slot_axes, axis=1, tiled=True) for x in local)
        return _merge(gathered, c)

    slots = PartitionSpec(None, spec[1])
    in_specs = (PartitionSpec(None, spec[1], None),) + (slots,) * 4 + (
        PartitionSpec(spec[1]), PartitionSpec(), PartitionSpec())
    return jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=PartitionSpec(),
                         check_vma=False)(*args)


def rerank(sim, ids, count, last, step, rng, cfg: SearchConfig) -> SearchResult:
    """Diversity re-rank of candidates [B, C] (similarity order) down to the best k."""
    b, c = sim.shape
    live = ids != NEVER
    rank = jnp.arange(c, dtype=jnp.float32)
    recent = (last != NEVER) & (jnp.asarray(step, jnp.int32) - last < cfg.recency_window)
    score = -rank - cfg.count_penalty * jnp.log1p(count.astype(jnp.float32)) \
        - cfg.recency_penalty * recent.astype(jnp.float32)
    score = jnp.where(live, score, -jnp.inf)
    order = jnp.argsort(-score, axis=1, stable=True)       # ties keep similarity order
    top = order[:, 0]
    n_live = live.sum(1)
    draw = jax.random.uniform(rng, (b,)) < cfg.demote_prob
    demote = draw & jnp.take_along_axis(recent, top[:, None], axis=1)[:, 0] & (n_live > 1)
    # Demotion rotates the live prefix of `order` left by one: the old top-1 lands last among
    # the live candidates, empty candidates stay behind it.
    j = jnp.arange(c)[None, :]
    last_live = (n_live - 1)[:, None]
    rotated = jnp.where(j < last_live, j + 1, jnp.where(j == last_live, 0, j))
    perm = jnp.where(demote[:, None], rotated, j)
    order = jnp.take_along_axis(order, perm, axis=1)[:, :cfg.k]
    pick = lambda x: jnp.take_along_axis(x, order, axis=1)
    return SearchResult(entry_ids=pick(ids), similarity=pick(sim), score=pick(score))


def search(bank: Bank, queries, task_ids, rng, step, *, cfg: SearchConfig,
           mesh: Mesh | None = None) -> SearchResult:
    """Search `queries` [B, E] each in its partition `task_ids` [B], then re-rank to top `cfg.k`.

    Jit with `static_argnames=("cfg", "mesh")`. Concrete inputs are checked here; inside jit the
    caller (the manager) has already checked them."""
    if not isinstance(queries, jax.core.Tracer) and not isinstance(task_ids, jax.core.Tracer):
        _check_inputs(bank, queries, task_ids)
    queries = jnp.asarray(queries).astype(bank.keys.dtype)
    task_ids = jnp.asarray(task_ids, jnp.int32)
    sim, ids, count, last, _ = candidates(bank, queries, task_ids, cfg, mesh)
    return rerank(sim, ids, count, last, step, rng, cfg)


def _check_inputs(bank: Bank, queries, task_ids) -> None:
    q, t = np.shape(queries), np.shape(task_ids)
    if len(q) != 2 or q[1] != bank.dim:
        raise ValueError(f"queries must be [B, {bank.dim}], got shape {q}")
    if t != (q[0],):
        raise ValueError(f"task_ids must be [{q[0]}] (one per query), got shape {t}")
    if isinstance(task_ids, (np.ndarray, list, tuple)) and len(task_ids):
        tids = np.asarray(task_ids)
        if tids.min() < 0 or tids.max() >= bank.num_tasks:
            raise ValueError(f"task_ids must be in [0, {bank.num_tasks}), got {tids.min()}..{tids.max()}")


class BankFns(NamedTuple):
    """The bank's functions, jitted once by whoever owns the device (the trainer) and handed to
    the host-side manager, which never jits anything itself."""
    apply_changes: Callable
    search: Callable
    mark_retrieved: Callable
    mark_trained: Callable


def jit_bank_fns(cfg: SearchConfig, mesh: Mesh | None = None, donate: bool = True) -> BankFns:
    """Jitted bank functions; with `donate` the bank's buffers are reused in place, so a caller
    must not touch a bank after passing it in."""
    d = (0,) if donate else ()
    return BankFns(
        apply_changes=jax.jit(apply_changes, donate_argnums=d),
        search=jax.jit(functools.partial(search, cfg=cfg, mesh=mesh)),
        mark_retrieved=jax.jit(mark_retrieved, donate_argnums=d),
        mark_trained=jax.jit(mark_trained, donate_argnums=d))
