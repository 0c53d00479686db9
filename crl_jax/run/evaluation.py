"""Evaluation on the test split, and the start evaluation that a run keeps in its workdir.

An evaluation plays every test task without and (if there is a bank) with experience, with
sampling seeds of its own and without touching the bank's retrieval counters, so evaluating
never changes training. The start evaluation, before the first RL step, is kept in
`<workdir>/start_eval.json` under a digest of what it depends on, so a run stopped before its
first step does not play it again, and a sibling method's copy of it counts too (see
experiments/reproduce.py).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

import jax

from crl_jax.config import RunConfig, to_dict
from crl_jax.rollout.trajectory import EpisodeSpec
from crl_jax.run import episodes
from crl_jax.run import metrics as metrics_lib
from crl_jax.run.checkpoint import config_digest

log = logging.getLogger("crl_jax")

START_EVAL_FILE = "start_eval.json"

# Settings that act only from the first RL step on. Methods that differ in these alone (Comp. RL,
# static online experience, experience only) evaluate the same actor and bank before it, the very
# same episodes: their start evaluations of one seed are equal to the last digit, so a grid plays
# it once per seed and copies it (9-13 minutes a run on the 6-task mixture on 2 CPU cores).
TRAINING_ONLY_SETTINGS = ("steps", "log_every", "checkpoint", "extractor.train", "rl.train_actor")

# (specs, step, use_memory, seed) -> trajectories; retrieval counters untouched.
PlayFn = Callable[[list, int, bool, int], list]


def episode_seed(seed: int, step: int, salt: int) -> int:
    """The sampling seed of a step's rollouts (salt 0) or of an evaluation (salt >= 100)."""
    return (seed * 7919 + step * 31 + salt) % (2 ** 31)


def start_eval_identity(config: dict) -> str:
    """The part of a start evaluation's key that a run's configuration (a dict, as `to_dict` or
    config.json has it) gives: everything but TRAINING_ONLY_SETTINGS."""
    return config_digest(config, ignore=TRAINING_ONLY_SETTINGS)


def start_eval_digest(cfg: RunConfig, warm_start: dict) -> str:
    """What a start evaluation depends on: the configuration (start_eval_identity) and the
    warm start RL begins from, as its metrics tell it (the actor's fingerprint, the halves'
    losses), less the time it took."""
    weights = {k: v for k, v in warm_start.items() if k != "warm_start/time_s"}
    return config_digest({"config": start_eval_identity(to_dict(cfg)), "warm_start": weights})


class Evaluator:
    def __init__(self, cfg: RunConfig, test_tasks: list[dict], play: PlayFn, has_bank: bool,
                 workdir: str, hosts=None, cache_from: tuple[str, ...] = ()):
        self.cfg, self.test_tasks, self.play, self.has_bank = cfg, test_tasks, play, has_bank
        self.workdir, self.hosts, self.cache_from = workdir, hosts, tuple(cache_from)

    def evaluate(self, step: int, salt: int = 100) -> dict[str, float]:
        """Test-split success and actions, without and (if there is a bank) with experience."""
        cfg, out = self.cfg, {}
        started = time.perf_counter()
        variants = []
        if cfg.eval.without_experience:
            variants.append((metrics_lib.EVAL_WITHOUT_EXP, False))
        if cfg.eval.with_experience and self.has_bank:
            variants.append((metrics_lib.EVAL_WITH_EXP, True))
        width = cfg.rollout.groups_per_step * cfg.rollout.group_size
        for offset, (prefix, with_exp) in enumerate(variants):
            specs = [EpisodeSpec(t["env"], int(t["seed"]), i, with_exp)
                     for i, t in enumerate(self.test_tasks)]
            trajectories = []
            # An evaluation plays hundreds of episodes (minutes on a CPU): show how far it is.
            progress = metrics_lib.Progress(len(specs), every=1, label=f"{prefix} episodes")
            for start in range(0, len(specs), width):
                chunk = specs[start:start + width]
                # Same batch width as training, so the compiled sampler is reused.
                padded = chunk + [chunk[0]] * (width - len(chunk))
                trajs = self.play(padded, step, with_exp, episode_seed(cfg.seed, step, salt + offset))
                trajectories += trajs[:len(chunk)]
                progress.update(len(trajectories))
            progress.close()
            out.update(episodes.episode_metrics(trajectories, prefix))
        out[metrics_lib.TIME_EVAL] = time.perf_counter() - started
        return out

    def start_evaluation(self, warm_start: dict) -> dict[str, float]:
        """The evaluation before the first RL step, at step 0's bank state with its own sampling
        seeds, kept under start_eval_digest(config, `warm_start`); taken from this workdir or,
        failing that, from the first sibling workdir in `cache_from` that kept one under the
        same digest."""
        path = os.path.join(self.workdir, START_EVAL_FILE)
        digest = start_eval_digest(self.cfg, warm_start)
        kept, source = None, None
        for source in (self.workdir, *self.cache_from):
            kept = _kept_metrics(os.path.join(source, START_EVAL_FILE), digest)
            if kept is not None:
                break
        found = int(kept is not None)
        # Every host plays the evaluation or none does (it runs collectives): all must have it.
        if (min(self.hosts.allgather(found)) if self.hosts else found):
            log.info("start evaluation: kept in %s", os.path.join(source, START_EVAL_FILE))
            if source == self.workdir:
                return kept
            metrics = kept  # a sibling's: this workdir keeps its own copy from now on
        else:
            metrics = self.evaluate(0, salt=200)
        if jax.process_index() == 0:
            with open(path + ".tmp", "w") as f:
                json.dump({"digest": digest, "metrics": metrics}, f)
            os.replace(path + ".tmp", path)  # never a half-written record
        return metrics


def _kept_metrics(path: str, digest: str) -> dict | None:
    """The metrics of the start evaluation kept at `path` under `digest`, else None."""
    try:
        with open(path) as f:
            record = json.load(f)
        return record["metrics"] if record["digest"] == digest else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or not one this code wrote
