"""Experience-bank arrays: a fixed-capacity, device-resident pytree and its pure update functions.

The bank holds, per slot, the key embedding an entry is found by and the bookkeeping retrieval and
extractor training need (validity, entry id, creation step, retrieval and training counters). The
text of every entry lives on the host in `text_store.py`, keyed by the same entry id; search and
re-rank live in `search.py`.

Layout is `[P, M]`: P task partitions of M slots each, rather than one flat array of P*M slots with
a task id per slot. Capacity and FIFO eviction are per task (the paper keeps 20,000 entries per
task), so "the oldest entry of task p" is an argmin over one row and a full task never evicts
another task's entries; a query only ever searches its own row. Only the slot axis M is sharded
over devices (logical axis "memory_slots"), so each device holds the same slice of every task and
per-task search work is balanced across devices whatever the task mix.

Entry ids come from a bank-wide counter that only grows, so within a row "oldest" is simply "the
smallest valid id": FIFO order needs no separate sequence field.

Legend: P task partitions, M slots per partition, E embedding, A entries added in one call,
D entry ids deleted in one call, n ids marked in one call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

NEVER = -1  # step value of "never retrieved / never trained"; also the id of an empty slot


@struct.dataclass
class Bank:
    keys: jax.Array                 # [P, M, E] key embeddings (L2-normalised by the embedder)
    valid: jax.Array                # [P, M] bool
    entry_id: jax.Array             # [P, M] int32, NEVER on empty slots
    created_step: jax.Array         # [P, M] int32
    last_retrieved_step: jax.Array  # [P, M] int32, NEVER until first shown to the actor
    retrieval_count: jax.Array      # [P, M] int32, times shown to the actor
    train_count: jax.Array          # [P, M] int32, times its generation was trained on
    last_trained_step: jax.Array    # [P, M] int32
    next_id: jax.Array              # [] int32, the id the next added entry gets

    @property
    def num_tasks(self) -> int:
        return self.valid.shape[0]

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    @property
    def dim(self) -> int:
        return self.keys.shape[2]

    @property
    def task_id(self) -> jax.Array:
        """[P, M] task of each slot (its partition), NEVER on empty slots."""
        rows = jnp.arange(self.num_tasks, dtype=jnp.int32)[:, None]
        return jnp.where(self.valid, rows, NEVER)


def init_bank(num_tasks: int, capacity: int, dim: int, dtype=jnp.float32) -> Bank:
    if num_tasks < 1 or capacity < 1 or dim < 1:
        raise ValueError(f"bank needs num_tasks, capacity, dim >= 1, got {num_tasks}, {capacity}, {dim}")
    shape = (num_tasks, capacity)
    # Every field gets its own buffer: the jitted bank functions donate the whole bank, and a
    # buffer shared by two fields would be donated twice.
    never = lambda: jnp.full(shape, NEVER, jnp.int32)  # noqa: E731
    zeros = lambda: jnp.zeros(shape, jnp.int32)  # noqa: E731
    return Bank(keys=jnp.zeros((*shape, dim), dtype), valid=jnp.zeros(shape, bool), entry_id=never(),
                created_step=zeros(), last_retrieved_step=never(), retrieval_count=zeros(),
                train_count=zeros(), last_trained_step=never(), next_id=jnp.zeros((), jnp.int32))


def bank_logical_axes() -> Bank:
    """Logical-axis names per field (for `crl_jax.sharding.tree_shardings`): slots are sharded,
    the task axis and the embedding are not."""
    per_slot = (None, "memory_slots")
    return Bank(keys=(None, "memory_slots", "embedding"), valid=per_slot, entry_id=per_slot,
                created_step=per_slot, last_retrieved_step=per_slot, retrieval_count=per_slot,
                train_count=per_slot, last_trained_step=per_slot, next_id=())


def _named(bank: Bank, ids: jax.Array) -> jax.Array:
    """[D, P, M] whether id d (NEVER entries ignored: no valid slot holds NEVER) names valid slot
    (p, m)."""
    ids = jnp.asarray(ids, jnp.int32).reshape(-1)
    return (bank.entry_id[None] == ids[:, None, None]) & bank.valid[None]


def _matches(bank: Bank, ids: jax.Array) -> jax.Array:
    """[P, M] how many of `ids` name each valid slot's entry."""
    return _named(bank, ids).sum(0, dtype=jnp.int32)


def delete(bank: Bank, ids: jax.Array) -> tuple[Bank, jax.Array]:
    """Remove the entries named by `ids` [D] (NEVER = padding; unknown ids are ignored).

    Returns the bank and how many slots were freed."""
    named = _named(bank, ids)
    hit = named.any(0)
    bank = bank.replace(valid=bank.valid & ~hit, entry_id=jnp.where(hit, NEVER, bank.entry_id),
                        keys=_zero_named_keys(bank.keys, named))
    return bank, hit.sum(dtype=jnp.int32)


def _zero_named_keys(keys: jax.Array, named: jax.Array) -> jax.Array:
    """`keys` with the rows of the slots in `named` [D, P, M] zeroed, so that a deleted entry's
    key scores 0, like an unused slot's, instead of outscoring live entries: the search's
    shortcut (`search.masked_top_k`) then holds. A scatter of the D rows, not a pass over every
    key; each id names at most one slot, found by sums rather than a flattened argmax, which
    keeps the slot axis sharded."""
    p, m, _ = keys.shape
    found = named.any((1, 2))
    task = (named * jnp.arange(p, dtype=jnp.int32)[:, None]).sum((1, 2), dtype=jnp.int32)
    slot = (named * jnp.arange(m, dtype=jnp.int32)).sum((1, 2), dtype=jnp.int32)
    return keys.at[jnp.where(found, task, p), slot].set(0, mode="drop")


def _add_one(bank: Bank, key: jax.Array, task: jax.Array, step: jax.Array):
    row_valid, row_ids = bank.valid[task], bank.entry_id[task]
    # An empty slot scores -1 and wins; in a full row the smallest id (the oldest entry) wins.
    slot = jnp.argmin(jnp.where(row_valid, row_ids, -1))
    evicted = jnp.where(row_valid[slot], row_ids[slot], NEVER)
    new_id = bank.next_id
    at = (task, slot)
    bank = bank.replace(
        keys=bank.keys.at[at].set(key.astype(bank.keys.dtype)),
        valid=bank.valid.at[at].set(True),
        entry_id=bank.entry_id.at[at].set(new_id),
        created_step=bank.created_step.at[at].set(step),
        last_retrieved_step=bank.last_retrieved_step.at[at].set(NEVER),
        retrieval_count=bank.retrieval_count.at[at].set(0),
        train_count=bank.train_count.at[at].set(0),
        last_trained_step=bank.last_trained_step.at[at].set(NEVER),
        next_id=new_id + 1)
    return bank, new_id, evicted


def add(bank: Bank, keys: jax.Array, task_ids: jax.Array, step, mask: jax.Array | None = None):
    """Add entries `keys` [A, E] to partitions `task_ids` [A] in order; rows with `mask` False are
    padding and change nothing (so callers can pad A to a fixed size and never recompile).

    A full partition evicts its oldest entry (FIFO). Returns `(bank, new_ids [A], evicted_ids [A])`
    with NEVER where nothing was added or evicted."""
    keys = jnp.asarray(keys)
    task_ids = jnp.asarray(task_ids, jnp.int32)
    mask = jnp.ones(task_ids.shape, bool) if mask is None else jnp.asarray(mask, bool)
    step = jnp.asarray(step, jnp.int32)

    def scan_body(bank, x):
        key, task, keep = x
        none = jnp.asarray(NEVER, jnp.int32)
        bank, new_id, evicted = jax.lax.cond(
            keep, lambda b: _add_one(b, key, task, step), lambda b: (b, none, none), bank)
        return bank, (new_id, evicted)

    bank, (new_ids, evicted) = jax.lax.scan(scan_body, bank, (keys, task_ids, mask))
    return bank, new_ids, evicted


def apply_changes(bank: Bank, delete_ids: jax.Array, keys: jax.Array, task_ids: jax.Array, step,
                  mask: jax.Array | None = None):
    """Deletes first, then adds: one extractor output's whole effect in a single call (an update
    is "delete the targets, add one"). Freed slots are reused before anything is evicted.

    Returns `(bank, new_ids [A], evicted_ids [A], n_deleted)`."""
    bank, n_deleted = delete(bank, delete_ids)
    bank, new_ids, evicted = add(bank, keys, task_ids, step, mask)
    return bank, new_ids, evicted, n_deleted


def update(bank: Bank, target_ids: jax.Array, key: jax.Array, task_id, step):
    """Delete `target_ids` [D] and add one entry `key` [E] to `task_id`.

    Returns `(bank, new_id, evicted_id)`."""
    bank, new_ids, evicted, _ = apply_changes(
        bank, target_ids, jnp.asarray(key)[None], jnp.asarray(task_id, jnp.int32)[None], step)
    return bank, new_ids[0], evicted[0]


def mark_retrieved(bank: Bank, ids: jax.Array, step) -> Bank:
    """Record that the entries `ids` (any shape, NEVER = nothing shown) were shown to the actor at
    `step`; an id shown to several rollouts counts once per rollout."""
    hits = _matches(bank, ids)
    return bank.replace(
        retrieval_count=bank.retrieval_count + hits,
        last_retrieved_step=jnp.where(hits > 0, jnp.asarray(step, jnp.int32), bank.last_retrieved_step))


def mark_trained(bank: Bank, ids: jax.Array, step) -> Bank:
    """Record that the extractor was trained on the generations of entries `ids` at `step`."""
    hits = _matches(bank, ids)
    return bank.replace(
        train_count=bank.train_count + hits,
        last_trained_step=jnp.where(hits > 0, jnp.asarray(step, jnp.int32), bank.last_trained_step))


def train_weights(bank: Bank, ids: jax.Array, step, cooldown: int, power: float) -> jax.Array:
    """Eq. 7 sample weights for entries `ids` [n]: 0 within `cooldown` steps of the entry's last
    training, else (1 + training count) ** -power. Ids no longer in the bank weigh 1."""
    ids = jnp.asarray(ids, jnp.int32).reshape(-1)
    match = (bank.entry_id[None] == ids[:, None, None]) & bank.valid[None]      # [n, P, M]
    count = jnp.where(match, bank.train_count[None], 0).sum((1, 2))
    last = jnp.where(match, bank.last_trained_step[None], NEVER).max((1, 2))
    cooling = (last != NEVER) & (jnp.asarray(step, jnp.int32) - last < cooldown)
    return jnp.where(cooling, 0.0, (1.0 + count) ** (-power)).astype(jnp.float32)
