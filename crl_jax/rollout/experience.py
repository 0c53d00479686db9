"""The experience side of a rollout step: retrieval, search-and-ask refinement, distillation, merge.

Glue between the host-side `MemoryManager` (bank + text store) and the extractor's sampler
(`ExtractorClient`). Extractor params are passed into every call, so a caller can run distillation
with the current weights on a background thread while the actor trains.

The service also keeps, until the trainer takes them for `samples.jsonl`, one output of each parse
outcome per distillation and merge pass (`take_output_samples`): the counters say how many outputs
were unparsable, these say what they looked like.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

import jax

from crl_jax import envs
from crl_jax.envs.registry import factory as env_factory
from crl_jax.memory import prompts
from crl_jax.memory.manager import MemoryManager
from crl_jax.memory.text_store import Entry, Generation
from crl_jax.rollout.extractor import ExtractorClient
from crl_jax.rollout.trajectory import Trajectory
from crl_jax.run import metrics as metrics_lib


class ExperienceService:
    def __init__(self, manager: MemoryManager, extractor: ExtractorClient, seed: int):
        self.manager, self.extractor, self.seed = manager, extractor, seed
        self.stats: collections.Counter[str] = collections.Counter()
        # Distillation may run on a background thread while the trainer takes the samples.
        self._samples_lock = threading.Lock()
        self._output_samples: list[dict] = []
        self._drifting: dict | None = None

    def _keep_samples(self, kind: str, step: int, outputs) -> None:
        """Keep the first output of each outcome of one pass; `outputs` yields (task, outcome,
        text, generation)."""
        seen, kept = set(), []
        for task, outcome, text, gen in outputs:
            if outcome not in seen:
                seen.add(outcome)
                kept.append({"kind": kind, "step": step, "task": task, "outcome": outcome,
                             "prompt_tokens": len(gen.prompt_ids) if gen is not None else None,
                             "response_tokens": len(gen.response_ids) if gen is not None else None,
                             "text": text})
        with self._samples_lock:
            self._output_samples += kept

    def bank_metrics(self, step: int) -> dict[str, float]:
        """The bank's size and retrieved share, and for drifting environments (envs/doors.py) its
        precision: the share of their live entries that state a fact true at `step`."""
        out = metrics_lib.bank_metrics(self.manager)
        truths = {task: env.current_facts(step) for task, env in self._drifting_envs().items()}
        if truths:
            with self.manager.lock:
                entries = [(e.task, e.content) for e in self.manager.store if e.task in truths]
            true = sum(any(fact in content for fact in truths[task]) for task, content in entries)
            out[metrics_lib.BANK_PRECISION] = true / max(len(entries), 1)
        return out

    def _drifting_envs(self) -> dict:
        """task -> an instance of its environment, for the tasks whose facts drift."""
        if self._drifting is None:
            self._drifting = {task: envs.make(task) for task in self.manager.cfg.tasks
                              if hasattr(env_factory(task), "current_facts")}
        return self._drifting

    def take_output_samples(self) -> list[dict]:
        """The extractor outputs kept since the last call (one per outcome per pass), oldest first."""
        with self._samples_lock:
            taken, self._output_samples = self._output_samples, []
        return taken

    def _rng(self, step: int, salt: int):
        return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self.seed), step), salt)

    def _gen_seed(self, step: int, salt: int) -> int:
        return (self.seed * 1_000_003 + step * 101 + salt) % (2 ** 31)

    def retrieve(self, queries: Sequence[str], tasks: Sequence[str], step: int,
                 count: bool = True) -> list[Entry | None]:
        """The top entry for each query (None where its task partition is empty); counted as shown
        unless `count` is False (evaluation must not change what training retrieves)."""
        if not queries:
            return []
        found = self.manager.retrieve(list(queries), list(tasks), step, self._rng(step, 0))
        entries = [row[0] if row else None for row in found]
        if count:
            self.manager.mark_shown([e.entry_id for e in entries if e is not None], step)
            self.stats["retrievals"] += len(queries)
            self.stats["retrieval_hits"] += sum(e is not None for e in entries)
        return entries

    def refiner(self, params, step: int, count: bool = True):
        """A search-and-ask handler for one rollout: each call answers one batch of tool calls."""
        calls = [0]

        def refine(queries: list[tuple[str, str]]) -> list[tuple[str | None, Generation | None]]:
            calls[0] += 1
            tasks = [t for t, _ in queries]
            questions = [q for _, q in queries]
            found = self.manager.retrieve(questions, tasks, step, self._rng(step, 1000 + calls[0]))
            answers: list[tuple[str | None, Generation | None]] = [(None, None)] * len(queries)
            asks = [(i, row[0]) for i, row in enumerate(found) if row]
            if count:
                self.manager.mark_shown([entry.entry_id for _, entry in asks], step)
            replies = self.extractor.generate(
                params, [prompts.refine_messages(questions[i], entry.render()) for i, entry in asks],
                seed=self._gen_seed(step, 1000 + calls[0]), kind="refine")
            for (i, _), (text, gen) in zip(asks, replies):
                answers[i] = (text.strip() or None, gen)
            self.stats["refinements"] += len(asks) if count else 0
            return answers

        return refine

    def distill(self, params, trajectories: Sequence[Trajectory], entries: Sequence[Entry | None],
                step: int) -> dict[str, int]:
        """Send every finished guided episode to the extractor and apply its operations."""
        if not trajectories:
            return {}
        conversations = [prompts.distill_messages(t.success, prompts.distill_transcript(
            t.messages, t.final_observation), [e.render()] if e else []) for t, e in zip(trajectories, entries)]
        replies = self.extractor.generate(params, conversations, seed=self._gen_seed(step, 1),
                                          kind="distill")
        reasons: collections.Counter[str] = collections.Counter()
        before = self._bank_writes()
        outputs = []
        for traj, entry, (text, gen) in zip(trajectories, entries, replies):
            reason, written = self.manager.distill(traj.spec.task, traj.query, text,
                                                   [entry.entry_id] if entry else [], step, gen)
            reasons[reason] += 1
            reasons["entries_written"] += len(written)
            outputs.append((traj.spec.task, reason, text, gen))
        after = self._bank_writes()
        reasons.update(_increase(before, after))
        self.stats.update(reasons)
        self._keep_samples("distill", step, outputs)
        return dict(reasons)

    def _bank_writes(self) -> dict[str, int]:
        """The manager's cumulative counts of entries added, updated and evicted (distillations
        run on one thread at a time, so the difference across one pass is that pass's)."""
        with self.manager.lock:
            return {f"entries_{k}": n for k, n in self.manager.writes.items()}

    def merge(self, params, step: int) -> dict[str, int]:
        """Run the periodic merge if `step` is due; returns its counts: extractor `calls`, entries
        `removed` and `written`, and `outcome/<reason>` per call (ok, return, unparsable, ...)."""
        calls = [0]
        generated, outcomes = [], []

        def generate(messages):
            calls[0] += 1
            (text, gen), = self.extractor.generate(params, [messages],
                                                   seed=self._gen_seed(step, 5000 + calls[0]),
                                                   kind="merge")
            generated.append((text, gen))
            return text, gen

        before = self._merge_outcomes()
        merged = self.manager.maybe_merge(step, generate, outcomes=outcomes)
        after = self._merge_outcomes()
        self._keep_samples("merge", step, [(None, outcome, text, gen) for (text, gen), outcome
                                           in zip(generated, outcomes, strict=True)])
        out = {"calls": calls[0], "removed": sum(r for r, _ in merged.values()),
               "written": sum(w for _, w in merged.values())}
        # The manager's counters are cumulative; only merges write the "merge_" ones, and merges
        # run on this thread, so the difference is this pass's.
        out.update({f"outcome/{k}": n for k, n in _increase(before, after).items()})
        return out

    def host_state(self) -> dict:
        """The text side of the bank and the counters, as JSON for a checkpoint's host state."""
        _, memory = self.manager.state()
        return {"memory": memory, "memory_reasons": dict(self.stats)}

    def restore(self, bank, host: dict) -> None:
        self.manager.restore(bank, host["memory"])
        self.stats.clear()
        self.stats.update(host["memory_reasons"])

    def _merge_outcomes(self) -> dict[str, int]:
        with self.manager.lock:
            return {k[len("merge_"):]: n for k, n in self.manager.reasons.items() if k.startswith("merge_")}


def _increase(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that grew from `before` to `after` (two reads of a cumulative counter), by
    how much."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
