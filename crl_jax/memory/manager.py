"""The experience manager: the host-side owner of the bank, keeping arrays and text in step.

It retrieves entries for actor queries, applies extractor outputs (parsed by ops.py) as one
all-or-nothing change to both the device bank and the text store, runs the periodic chunked merge
per task, counts why outputs were dropped, and hands its state to the checkpoint as a pytree of
arrays plus JSON. It never jits: the bank functions arrive ready-jitted (`search.jit_bank_fns`),
the embedder and the merge generator are callables.

Every change is validated in full before anything is written; the device call that follows
cannot fail on validated input, and the text store is then updated from its exact result
(assigned ids, evicted ids).

Thread safety: one re-entrant lock (`manager.lock`) guards the bank and the text store, so
distillation may run in a background thread while the rollout retrieves. Slow work (parsing,
embedding, merge generations) happens outside the lock; merge commits re-check, under the lock,
that the entries they replace still exist. Code reading `manager.bank` directly (e.g. for Eq. 7
weights) should hold `manager.lock`, since the jitted functions donate the old bank.

Legend: B queries, E embedding, A entries added in one call, D entry ids deleted in one call.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence

import jax
import numpy as np

from crl_jax.memory import ops
from crl_jax.memory.bank import NEVER, Bank, init_bank
from crl_jax.memory.consistency import bank_problem
from crl_jax.memory.prompts import merge_messages
from crl_jax.memory.search import BankFns
from crl_jax.memory.text_store import Entry, Generation, TextStore, render_entry
from crl_jax.shapes import pow2_bucket

# (chat messages) -> (generated text, its Generation or None); the extractor's sampler.
MergeGenerate = Callable[[list[dict]], tuple[str, "Generation | None"]]


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    tasks: tuple[str, ...]
    capacity: int = 20_000          # entries per task
    dim: int = 384
    merge_every: int = 5            # steps between merges; 0 = never
    merge_chunk: int = 5            # entries per merge call

    def __post_init__(self):
        problems = []
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            problems.append(f"tasks must be non-empty and distinct, got {self.tasks}")
        for name in ("capacity", "dim", "merge_chunk"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.merge_every < 0:
            problems.append(f"merge_every must be >= 0, got {self.merge_every}")
        if problems:
            raise ValueError("invalid MemoryConfig: " + "; ".join(problems))


def _bucket(n: int) -> int:
    return pow2_bucket(n, least=4)


def _padded_ids(ids: Sequence[int], size: int) -> np.ndarray:
    out = np.full((size,), NEVER, np.int32)
    out[:len(ids)] = ids
    return out


class MemoryManager:
    def __init__(self, cfg: MemoryConfig, fns: BankFns, embed: Callable[[Sequence[str]], np.ndarray],
                 bank: Bank | None = None, store: TextStore | None = None):
        self.cfg, self.fns, self.embed = cfg, fns, embed
        self.bank = bank if bank is not None else init_bank(len(cfg.tasks), cfg.capacity, cfg.dim)
        self.store = store if store is not None else TextStore()
        self.task_index = {t: i for i, t in enumerate(cfg.tasks)}
        self.reasons: collections.Counter[str] = collections.Counter()
        # Entries written and evicted, cumulative: "added", "updated", "evicted" (not saved: the
        # per-step metrics derived from them are).
        self.writes: collections.Counter[str] = collections.Counter()
        self.lock = threading.RLock()
        self._deferred: list | None = None

    def _task(self, task: str) -> int:
        if task not in self.task_index:
            raise KeyError(f"unknown task {task!r}; the bank has partitions {list(self.cfg.tasks)}")
        return self.task_index[task]

    def _keys(self, texts: Sequence[str]) -> np.ndarray:
        keys = np.asarray(self.embed(list(texts)), np.float32)
        if keys.shape != (len(texts), self.cfg.dim):
            raise ValueError(f"embedder returned shape {keys.shape}, expected ({len(texts)}, {self.cfg.dim})")
        return keys

    # ---- retrieval -------------------------------------------------------------------------

    def retrieve(self, queries: Sequence[str], tasks: Sequence[str], step: int, rng) -> list[list[Entry]]:
        """Entries for each query (best first, up to k), searched in its task's partition. Nothing
        is counted as retrieved until `mark_shown`."""
        if len(queries) != len(tasks):
            raise ValueError(f"{len(queries)} queries but {len(tasks)} tasks")
        if not queries:
            return []
        b = _bucket(len(queries))
        q = np.zeros((b, self.cfg.dim), np.float32)
        q[:len(queries)] = self._keys(queries)
        t = np.zeros((b,), np.int32)
        t[:len(tasks)] = [self._task(x) for x in tasks]
        with self.lock:
            result = jax.device_get(self.fns.search(self.bank, q, t, rng, np.int32(step)))
            return [[self.store[i] for i in row if i != NEVER] for row in result.entry_ids[:len(queries)]]

    def mark_shown(self, entry_ids: Sequence[int], step: int) -> None:
        """Count entries as shown to the actor (one count per rollout that saw it)."""
        ids = [int(i) for i in entry_ids if int(i) != NEVER]
        if ids and self._deferred is not None:
            self._deferred.append((ids, int(step)))
            return
        if ids:
            with self.lock:
                padded = _padded_ids(ids, _bucket(len(ids)))
                self.bank = self.fns.mark_retrieved(self.bank, padded, np.int32(step))

    @contextlib.contextmanager
    def deferred_marks(self):
        """Within the block, `mark_shown` queues (ids, step) instead of writing; yields the queue.
        A multi-host rollout replays every host's queue on every host afterwards, in one order."""
        queue: list[tuple[list[int], int]] = []
        self._deferred = queue
        try:
            yield queue
        finally:
            self._deferred = None

    def mark_trained(self, entry_ids: Sequence[int], step: int) -> None:
        ids = [int(i) for i in entry_ids if int(i) != NEVER]
        if ids:
            with self.lock:
                padded = _padded_ids(ids, _bucket(len(ids)))
                self.bank = self.fns.mark_trained(self.bank, padded, np.int32(step))

    # ---- writes ----------------------------------------------------------------------------

    def _commit(self, task: str, remove: Sequence[int],
                new: Sequence[tuple[str, str, str, Generation | None]],
                keys: np.ndarray, step: int) -> list[int]:
        """Delete `remove` and add `new` (title, content, query, generation) with `keys` [A, E].
        The caller holds the lock and has checked that every id in `remove` exists."""
        tid = self._task(task)
        a = _bucket(len(new))
        padded_keys = np.zeros((a, self.cfg.dim), np.float32)
        padded_keys[:len(new)] = keys
        mask = np.arange(a) < len(new)
        self.bank, new_ids, evicted, _ = self.fns.apply_changes(
            self.bank, _padded_ids(remove, _bucket(len(remove))), padded_keys,
            np.full((a,), tid, np.int32), np.int32(step), mask)
        new_ids, evicted = jax.device_get((new_ids, evicted))
        gone = {int(i) for i in evicted if i != NEVER}
        self.writes["evicted"] += len(gone - set(remove))  # for capacity, not the writer's removal
        entries = [Entry(int(i), task, title, content, query, int(step), gen)
                   for i, (title, content, query, gen) in zip(new_ids[:len(new)], new) if int(i) not in gone]
        self.store.apply(list(remove) + [i for i in gone if i in self.store], entries)
        return [e.entry_id for e in entries]

    def distill(self, task: str, query: str, output: str, retrieved_ids: Sequence[int], step: int,
                generation: Generation | None = None) -> tuple[str, list[int]]:
        """Apply one distillation output. `retrieved_ids` are the entries shown to the extractor as
        Memory Entry 1..n. Returns (reason, ids of the entries written)."""
        self._task(task)
        parsed = ops.parse_operations(output, len(retrieved_ids))
        keys = self._keys([query]) if parsed.ops else None        # embedding happens unlocked
        with self.lock:
            reason = parsed.reason
            if parsed.ops:
                # dict.fromkeys: the same entry may have been shown twice; delete it once.
                targets = list(dict.fromkeys(int(retrieved_ids[t]) for op in parsed.ops for t in op.targets))
                if any(t not in self.store for t in targets):
                    reason = "stale_target"    # a target was deleted or evicted since it was shown
                elif any(self.store[t].task != task for t in targets):
                    reason = "foreign_target"
            self.reasons[reason] += 1
            if reason != "ok":
                return reason, []
            new = [(op.title, op.content, query, generation) for op in parsed.ops]
            written = self._commit(task, targets, new, np.repeat(keys, len(new), axis=0), step)
            # A distillation that rewrites shown entries updates; one that only adds, adds.
            self.writes["updated" if targets else "added"] += len(written)
            return reason, written

    def delete_entries(self, entry_ids: Sequence[int], step: int) -> int:
        """Remove entries by id (unknown ids are an error, so nothing is half-done)."""
        ids = list(dict.fromkeys(int(i) for i in entry_ids))
        with self.lock:
            missing = [i for i in ids if i not in self.store]
            if missing:
                raise KeyError(f"cannot delete entry ids {missing}: not in the bank")
            if ids:
                self._commit(self.store[ids[0]].task, ids, [], np.zeros((0, self.cfg.dim), np.float32), step)
        return len(ids)

    def add_entry(self, task: str, title: str, content: str, query: str, step: int,
                  generation: Generation | None = None) -> int:
        """Write one entry directly (seeding a bank, tests)."""
        keys = self._keys([query])
        with self.lock:
            ids = self._commit(task, [], [(title, content, query, generation)], keys, step)
        return ids[0] if ids else NEVER

    # ---- merge -----------------------------------------------------------------------------

    def maybe_merge(self, step: int, generate: MergeGenerate,
                    outcomes: list[str] | None = None) -> dict[str, tuple[int, int]]:
        """Merge every task when `step` is a positive multiple of `merge_every`."""
        if self.cfg.merge_every == 0 or step <= 0 or step % self.cfg.merge_every:
            return {}
        return {task: self.merge_task(task, step, generate, outcomes=outcomes) for task in self.cfg.tasks}

    def merge_task(self, task: str, step: int, generate: MergeGenerate,
                   outcomes: list[str] | None = None) -> tuple[int, int]:
        """Sliding chunked merge over one task's entries, oldest first; the items a call keeps are
        carried into the next call. Returns (entries removed, entries written); `outcomes`, if
        given, gets each call's parse outcome appended, in call order."""
        with self.lock:
            entries = sorted((e for e in self.store if e.task == task), key=lambda e: e.entry_id)
        if len(entries) < 2:
            return 0, 0
        consumed: list[int] = []
        kept: list[tuple[str, str, Generation | None]] = []
        carried: list[tuple[str, str, Generation | None]] = []
        for start in range(0, len(entries), self.cfg.merge_chunk):
            chunk = entries[start:start + self.cfg.merge_chunk]
            shown = [render_entry(t, c) for t, c, _ in carried]
            shown += [e.render() for e in chunk]
            text, gen = generate(merge_messages(shown))
            items, reason = ops.parse_merge(text)
            if reason == "ok" and len(items) > len(shown):
                reason = "too_many_items"     # a merge may only shrink or keep its inputs
            with self.lock:
                self.reasons["merge_" + reason] += 1
            if outcomes is not None:
                outcomes.append(reason)
            if reason == "ok":
                consumed += [e.entry_id for e in chunk]
                carried = [(t, c, gen) for t, c in items]
            else:                             # keep this chunk; what was carried stays as is
                kept += carried
                carried = []
        kept += carried
        if not consumed:
            return 0, 0
        texts = [f"{t}\n{c}" for t, c, _ in kept]
        keys = self._keys(texts) if kept else np.zeros((0, self.cfg.dim), np.float32)
        new = [(t, c, q, g) for (t, c, g), q in zip(kept, texts)]
        with self.lock:
            # Generations ran unlocked: if an entry they replace is gone meanwhile (an update or an
            # eviction), the merged text may no longer reflect the bank, so nothing is written.
            if any(i not in self.store for i in consumed):
                self.reasons["merge_stale"] += 1
                return 0, 0
            written = self._commit(task, consumed, new, keys, step)
        return len(consumed), len(written)

    # ---- state -----------------------------------------------------------------------------

    def state(self) -> tuple[Bank, dict]:
        """(bank pytree, JSON-serialisable rest) for the checkpoint."""
        with self.lock:
            return self.bank, {"tasks": list(self.cfg.tasks), "text_store": self.store.to_json(),
                               "reasons": dict(self.reasons)}

    def restore(self, bank: Bank, state_json: dict) -> None:
        """Take a checkpoint's bank; ValueError (nothing changed) if it is not one this run wrote."""
        if list(state_json["tasks"]) != list(self.cfg.tasks):
            raise ValueError(f"checkpoint tasks {state_json['tasks']} != configured {list(self.cfg.tasks)}")
        try:
            store = TextStore.from_json(state_json["text_store"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"the bank's text store is malformed ({type(err).__name__}: {err})") from None
        problem = bank_problem(bank, store, list(self.cfg.tasks), self.cfg.capacity, self.cfg.dim)
        if problem:
            raise ValueError(problem)
        with self.lock:
            self.bank, self.store = bank, store
            self.reasons = collections.Counter(state_json.get("reasons", {}))

    def snapshot_json(self) -> dict:
        """Readable dump: every entry with its bank counters (for `python -m crl_jax.memory.show`)."""
        with self.lock:
            b, store, reasons = jax.device_get(self.bank), list(self.store), dict(self.reasons)
        rows = {}
        for p, s in zip(*np.nonzero(b.valid)):
            rows[int(b.entry_id[p, s])] = {
                "retrieval_count": int(b.retrieval_count[p, s]),
                "last_retrieved_step": int(b.last_retrieved_step[p, s]),
                "train_count": int(b.train_count[p, s]), "slot": int(s)}
        entries = []
        for e in store:
            d = e.to_json()
            d.pop("generation")
            d.update(rows.get(e.entry_id, {}))
            entries.append(d)
        return {"tasks": list(self.cfg.tasks), "capacity": self.cfg.capacity, "entries": entries,
                "reasons": reasons}
