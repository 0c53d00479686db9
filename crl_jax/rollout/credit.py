"""Credit assignment to the extractor, and its training batch.

Each guided episode credits the extractor generations whose output it used (the generation that
wrote its injected entry, and its search-and-ask refinements) with its outcome, in B_phi
(`RewardBuffer`). Once B_phi holds a batch, the batch's samples are weighted by Eq. 7
(`memory.bank.train_weights`: entries trained often or recently count less) and the entries they
came from are marked trained, deferred to the next step so that a background distillation never
races the mark.
"""

from __future__ import annotations

import jax
import numpy as np

from crl_jax.memory import bank as bank_lib
from crl_jax.rollout.reward_buffer import RewardBuffer
from crl_jax.rollout.trajectory import generations_batch
from crl_jax.run import metrics as metrics_lib
from crl_jax.shapes import length_bucket


class ExtractorCredit:
    def __init__(self, batch_size: int, cache_length: int, cooldown_steps: int, weight_power: float,
                 pad_id: int, fixed_length: bool = False):
        self.batch_size, self.cache_length, self.pad_id = batch_size, cache_length, pad_id
        self.cooldown_steps, self.weight_power = cooldown_steps, weight_power
        # Hosts of a multi-host run build the same shapes: they pad to the full cache length.
        self.fixed_length = fixed_length
        self.buffer = RewardBuffer()
        self.pending_trained: list[int] = []
        self.trained_at = 0
        self._train_weights = jax.jit(bank_lib.train_weights)

    @classmethod
    def from_config(cls, cfg, pad_id: int, fixed_length: bool = False) -> ExtractorCredit:
        """From the run's `extractor` section."""
        return cls(cfg.batch_size, cfg.cache_length, cfg.cooldown_steps, cfg.weight_power, pad_id,
                   fixed_length)

    def credit(self, trajectories, entries) -> None:
        """Add each guided episode's outcome to the generations it used."""
        for traj, entry in zip(trajectories, entries):
            if entry is not None and entry.generation is not None:
                self.buffer.add_use(entry.generation, traj.success, entry.entry_id)
            for gen in traj.refinements:
                self.buffer.add_use(gen, traj.success)

    def apply_marks(self, manager) -> None:
        """Mark the entries of the last extractor batch trained (their Eq. 7 counts)."""
        if self.pending_trained:
            manager.mark_trained(self.pending_trained, self.trained_at)
            self.pending_trained = []

    def batch(self, manager, step: int, metrics: dict):
        """The extractor's batch for this step's update (None until B_phi holds one); its
        statistics go into `metrics`."""
        samples = self.buffer.pop_batch(self.batch_size)
        if samples is None:
            return None
        ids = np.asarray([min(s.entry_ids) if s.entry_ids else bank_lib.NEVER for s in samples], np.int32)
        with manager.lock:  # the bank functions donate the bank; never read it mid-write
            weights = np.asarray(self._train_weights(manager.bank, ids, np.int32(step),
                                                     self.cooldown_steps, self.weight_power))
        weights = np.where(ids == bank_lib.NEVER, 1.0, weights)
        self.pending_trained = sorted({i for s in samples for i in s.entry_ids})
        self.trained_at = step
        metrics["extractor/reward"] = float(np.mean([s.reward for s in samples]))
        metrics[metrics_lib.EXTRACTOR_SAMPLES] = float(len(samples))
        metrics["extractor/weight_mean"] = float(weights.mean())
        longest = max(len(s.generation.prompt_ids) + len(s.generation.response_ids) for s in samples)
        length = self.cache_length if self.fixed_length else length_bucket(longest, self.cache_length)
        return generations_batch([(s.generation, s.reward, float(w)) for s, w in zip(samples, weights)],
                                 length, self.batch_size, self.pad_id)

    def state(self) -> dict:
        return {"buffer": self.buffer.to_json(), "pending_trained": self.pending_trained,
                "trained_at": self.trained_at}

    def restore(self, host: dict) -> None:
        self.buffer = RewardBuffer.from_json(host["buffer"])
        self.pending_trained = list(host["pending_trained"])
        self.trained_at = int(host["trained_at"])
