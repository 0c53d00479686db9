"""The warm start's caches: what each half depends on, and one half's folder as an Orbax checkpoint.

The actor's half is keyed on `cache_identity(cfg)["actor"]`, the extractor's on the whole
identity (its training data are the actor's demos), both with the warm-start settings passed in
and the tokenizer's fingerprint. `params_fingerprint` tells, from the logs alone, whether two runs
started RL from the very same actor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil

import jax
import numpy as np

from crl_jax.config import RunConfig, WarmStartConfig
from crl_jax.run.checkpoint import Checkpointer, CheckpointError, config_digest, portable_copy

log = logging.getLogger("crl_jax")

# WarmStartConfig fields that only the extractor's half reads.
EXTRACTOR_SETTINGS = ("extractor_steps", "merge_examples", "merge_lessons", "extractor_learning_rate")


def actor_settings(cfg: WarmStartConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in EXTRACTOR_SETTINGS}


def cache_identity(cfg: RunConfig) -> dict:
    """Every setting of a run that its warm start depends on, from its config alone, by half:
    {"actor": ..., "extractor": ... or None (no extractor)}.

    Runs with equal halves build the same warm start of that half (up to the last bit of CPU
    reductions): the trainer keys each cache on it (plus the tokenizer's fingerprint, a property of
    the built vocabulary), and experiments/reproduce.py shares finished caches between runs by it.
    How a run uses experience afterwards (search, merging, frozen roles, ...) is left out: the
    actor's demos do not depend on it.
    """
    actor = {"warm_start": actor_settings(cfg.warm_start), "tasks": list(cfg.tasks), "seed": cfg.seed,
             "tokenizer": cfg.tokenizer, "actor": dataclasses.asdict(cfg.actor),
             "max_turns": cfg.rollout.max_turns, "actor_max_len": cfg.rl.max_seq_len}
    extractor = None
    if cfg.memory.enabled:
        extractor = {"warm_start": {k: getattr(cfg.warm_start, k) for k in EXTRACTOR_SETTINGS},
                     "model": dataclasses.asdict(cfg.extractor_model),
                     "cache_length": cfg.extractor.cache_length,
                     "max_new_tokens": cfg.extractor.max_new_tokens}
    return {"actor": actor, "extractor": extractor}


def cache_digest(settings: dict, identity: dict, tokenizer_fingerprint) -> str:
    # The settings passed in, not only the run's identity, so a direct call with another
    # WarmStartConfig cannot pick up a cache built under different settings; and the tokenizer
    # itself, since the same config built a different one before the word tokenizer spelled out
    # unknown words (a cache copied from such a run is recomputed).
    return config_digest({"identity": identity, "warm_start": settings,
                          "tokenizer": tokenizer_fingerprint})


def finished(checkpoint_folder: str) -> bool:
    """Whether a half's checkpoint folder holds a saved step."""
    return os.path.isdir(checkpoint_folder) and any(n.isdigit() for n in os.listdir(checkpoint_folder))


class HalfCache:
    """One half's folder: its checkpoint (params + summary) and its training curves."""

    def __init__(self, folder: str, digest: str):
        self.folder, self.digest = folder, digest
        self.checkpointer = self._open()

    def _open(self) -> Checkpointer:
        return Checkpointer(os.path.join(self.folder, "checkpoint"), max_to_keep=1, async_save=False,
                            digest=self.digest)

    def load(self, params) -> tuple[object, dict] | None:
        """(params, summary) if a usable cache is there; an unusable one is deleted."""
        if self.checkpointer.latest_step() is None:
            return None
        try:
            _, tree, summary = self.checkpointer.restore({"params": params})
        except CheckpointError as err:
            log.warning("warm start cache in %s is unusable (%s); recomputing", self.folder, err)
            self.checkpointer.close()
            shutil.rmtree(self.folder)
            self.checkpointer = self._open()
            return None
        log.info("warm start: reusing %s (built in %.0f s)", self.folder, summary.get("time_s", 0.0))
        return tree["params"], summary

    def adopt(self, params, sources, half: str) -> tuple[object, dict] | None:
        """(params, summary) of a finished `half` taken from the first of the sibling workdirs
        `sources` whose cache was built under this one's digest: copied into this folder and
        loaded as its own (a copy under another digest is dropped, as `load` drops any)."""
        own = os.path.join(self.folder, "checkpoint")
        for source in sources:
            theirs = os.path.join(source, "warm_start", half, "checkpoint")
            if os.path.abspath(theirs) == os.path.abspath(own) or not finished(theirs):
                continue
            self.checkpointer.close()
            shutil.rmtree(own, ignore_errors=True)
            portable_copy(theirs, own)
            self.checkpointer = self._open()
            loaded = self.load(params)
            if loaded is not None:
                log.info("warm start: the %s half taken from %s", half, source)
                return loaded
        return None

    def save(self, params, summary: dict) -> None:
        self.checkpointer.save(1, {"params": params}, summary)
        self.checkpointer.wait()


def params_fingerprint(params) -> int | None:
    """A 48-bit fingerprint of `params`: sha256 over each leaf's path, dtype, shape and bytes, cut
    to 48 bits so that it is exact as a float64 metric. Equal fingerprints mean bitwise-equal
    weights (up to a 2^-48 chance). None where a leaf is not wholly held by this process (a
    multi-host model; the warm start is meant for tiny ones)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return None
        value = np.ascontiguousarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{value.dtype}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return int(digest.hexdigest()[:12], 16)
