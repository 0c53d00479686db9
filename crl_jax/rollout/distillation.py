"""When a step's guided episodes are distilled into the bank.

Distillation runs on a background thread while the actor trains, and the next step (or a
checkpoint, or an evaluation that reads the bank) joins it first, so what a step sees never
depends on timing. It runs in the foreground instead when the extractor's own weights are about
to be updated (they are donated to the train step), and always in multi-host runs, where every
host must issue its collectives in the same order. Joining also applies the extractor batch's
deferred Eq. 7 training marks (rollout/credit.py), so they never race a background write.
"""

from __future__ import annotations

import concurrent.futures
import time

from crl_jax.rollout.credit import ExtractorCredit
from crl_jax.rollout.experience import ExperienceService


class _Inline:
    """An executor that runs each job at once, on the caller's thread."""

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        future.set_result(fn(*args))
        return future


class DistillationQueue:
    def __init__(self, experience: ExperienceService | None, credit: ExtractorCredit, inline: bool):
        self.experience, self.credit = experience, credit
        self._executor = _Inline() if inline else concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self._pending = None

    def join(self) -> dict:
        """Wait for the previous distillation; returns its counts (empty if none ran)."""
        out = {}
        if self._pending is not None:
            out = self._pending.result()
            self._pending = None
        if self.experience is not None:
            self.credit.apply_marks(self.experience.manager)
        return out

    def submit(self, params, trajectories, entries, step: int, in_background: bool) -> tuple[dict, float]:
        """Distill the guided ones of `trajectories` with the extractor `params`. Returns the counts
        of a foreground distillation (empty in the background) and the seconds it took."""
        guided = [(t, e) for t, e in zip(trajectories, entries) if t.spec.guided]
        if self.experience is None or not guided:
            return {}, 0.0
        job = lambda: self.experience.distill(  # noqa: E731
            params, [t for t, _ in guided], [e for _, e in guided], step)
        if in_background:
            self._pending = self._executor.submit(job)
            return {}, 0.0
        started = time.perf_counter()
        return job(), time.perf_counter() - started
