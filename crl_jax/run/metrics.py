"""Scalar logging for training runs: metric key names, episode aggregation, writers, progress bar.

Owns
- the metric key names every producer and consumer shares (`METRIC_DOCS` documents each);
- `aggregate_episodes`: per-episode dicts -> mean scalars plus a per-task breakdown;
- `MetricsWriter`: TensorBoard event files and an append-only JSONL of scalars per step
  (`<workdir>/metrics.jsonl`, one `{"step": s, "time": t, key: value, ...}` object per line), both
  flushed every write so a killed run loses nothing it logged; `resume_from(step)` drops rows a
  restored run will log again;
- `Progress`: one status line with step/total, elapsed time, ETA and chosen scalars.

Only process 0 writes by default, so a multi-host run produces one log, not one per host.
Non-finite values are logged to TensorBoard as they are and to JSONL as `null` (JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from crl_jax.run.tensorboard_events import EventFileWriter

# --- Metric keys. Episode-level keys are "<prefix>/<field>" and, per task, "<prefix>/<field>/<task>".
SUCCESS, REWARD, ACTIONS, TOOL_CALLS, EPISODES = "success", "reward", "actions", "tool_calls", "episodes"
SUCCESS_ACTIONS = "success_actions"      # actions of successful episodes only (the paper's efficiency)
TRAIN = "train"                          # all K rollouts of the step's tasks
TRAIN_WITH_EXP = "train/with_exp"        # the experience-guided half of each group
TRAIN_WITHOUT_EXP = "train/without_exp"  # the experience-free half of each group
EVAL_WITH_EXP = "eval/with_exp"          # test split, experience retrieved into the prompt
EVAL_WITHOUT_EXP = "eval/without_exp"    # test split, no experience
START = "start"                          # "start/eval/...": evaluation before the first RL step


def key(prefix: str, field: str, task: str | None = None) -> str:
    """The metric name for `field` under `prefix`, optionally for one task."""
    return f"{prefix}/{field}" if task is None else f"{prefix}/{field}/{task}"


TRAIN_SUCCESS = key(TRAIN, SUCCESS)
TRAIN_REWARD = key(TRAIN, REWARD)
TRAIN_ACTIONS = key(TRAIN, ACTIONS)
TRAIN_WITH_EXP_SUCCESS = key(TRAIN_WITH_EXP, SUCCESS)
TRAIN_WITHOUT_EXP_SUCCESS = key(TRAIN_WITHOUT_EXP, SUCCESS)
EVAL_WITH_EXP_SUCCESS = key(EVAL_WITH_EXP, SUCCESS)
EVAL_WITHOUT_EXP_SUCCESS = key(EVAL_WITHOUT_EXP, SUCCESS)
EVAL_WITH_EXP_ACTIONS = key(EVAL_WITH_EXP, ACTIONS)
EVAL_WITHOUT_EXP_ACTIONS = key(EVAL_WITHOUT_EXP, ACTIONS)
EVAL_WITH_EXP_EPISODES = key(EVAL_WITH_EXP, EPISODES)
EVAL_WITHOUT_EXP_EPISODES = key(EVAL_WITHOUT_EXP, EPISODES)
TOOL_CALL_RATE = "rollout/tool_call_rate"
BANK_SIZE = "bank/size"
# Written by the distillations joined in a step (logged under "distill/") and by its merge.
BANK_ADDED, BANK_UPDATED = "distill/entries_added", "distill/entries_updated"
BANK_EVICTED, BANK_MERGED = "distill/entries_evicted", "bank/merge_removed"
BANK_RETRIEVALS = "bank/retrievals"
BANK_RETRIEVAL_HITS = "bank/retrieval_hits"
BANK_REFINEMENTS = "bank/refinements"
BANK_RETRIEVED_SHARE = "bank/retrieved_share"
BANK_PRECISION = "bank/precision"
# The train-step metrics keep the names `rl.train_step` gives them ("actor/<name>", "extractor/<name>").
ACTOR_LOSS, ACTOR_GRAD_NORM = "actor/loss", "actor/grad_norm"
ACTOR_PADDED_LENGTH = "actor/padded_length"  # set by rl.updater, which pads to the length bucket
EXTRACTOR_LOSS, EXTRACTOR_REWARD = "extractor/loss", "extractor/reward"
EXTRACTOR_BUFFER = "extractor/buffer_size"
EXTRACTOR_SAMPLES = "extractor/samples"
TIME_STEP = "time/step_s"
TIME_ACTOR_ROLLOUT = "time/actor_rollout_s"
TIME_ACTOR_UPDATE = "time/actor_update_s"
TIME_EXTRACTOR = "time/extractor_s"
TIME_EVAL = "time/eval_s"
HOST_RSS, HOST_PEAK_RSS = "host/rss_gb", "host/peak_rss_gb"
HOST_MALLOC_FREE = "host/malloc_free_gb"


def is_machine_figure(name: str) -> bool:
    """Whether a metrics.jsonl key measures the machine, not the training, so that two identical
    runs log different values: the row's "time", timings ("time/...", "start/time/eval_s",
    "warm_start/time_s") and host memory ("host/...")."""
    parts = name.split("/")
    return "time" in parts or "host" in parts or parts[-1] == "time_s"


METRIC_DOCS: dict[str, str] = {
    TRAIN_SUCCESS: "fraction of the step's training episodes that succeeded",
    TRAIN_REWARD: "mean episode return of the step's training episodes",
    TRAIN_ACTIONS: "mean number of environment actions per training episode",
    TRAIN_WITH_EXP_SUCCESS: "success rate of the experience-guided training rollouts",
    TRAIN_WITHOUT_EXP_SUCCESS: "success rate of the experience-free training rollouts",
    EVAL_WITH_EXP_SUCCESS: "test-split success rate with retrieved experience",
    EVAL_WITHOUT_EXP_SUCCESS: "test-split success rate without experience",
    EVAL_WITH_EXP_ACTIONS: "test-split mean actions per episode with experience",
    EVAL_WITHOUT_EXP_ACTIONS: "test-split mean actions per episode without experience",
    EVAL_WITH_EXP_EPISODES: "number of test episodes behind the eval/with_exp means",
    EVAL_WITHOUT_EXP_EPISODES: "number of test episodes behind the eval/without_exp means",
    TOOL_CALL_RATE: "mean search_and_ask calls per experience-guided episode",
    BANK_SIZE: "live entries in the experience bank after the step",
    BANK_ADDED: "entries the distillations joined this step added",
    BANK_UPDATED: "entries the distillations joined this step wrote over entries they were shown",
    BANK_EVICTED: "entries evicted for capacity by the distillations joined this step",
    BANK_MERGED: "entries removed by this step's merge (0 on steps without a merge)",
    BANK_PRECISION: "share of live entries of drifting tasks (diag/doors) that state a fact true now",
    BANK_RETRIEVALS: "retrievals made for this step's guided training episodes",
    BANK_RETRIEVAL_HITS: "of those, retrievals that injected an entry into the system prompt",
    BANK_REFINEMENTS: "search_and_ask calls answered with a refined entry this step",
    ACTOR_LOSS: "actor policy loss of the update",
    ACTOR_GRAD_NORM: "global gradient norm of the actor update",
    ACTOR_PADDED_LENGTH: "tokens per row of the actor's update batch, its length bucket (each new "
                         "one compiles the update; a longer one costs more per update)",
    EXTRACTOR_LOSS: "extractor policy loss (logged on steps that update the extractor)",
    EXTRACTOR_REWARD: "mean reward of the extractor samples in its update batch (the trainer's "
                      "value; the train step's own is extractor/reward_mean)",
    EXTRACTOR_BUFFER: "extractor samples waiting in the buffer after the step",
    EXTRACTOR_SAMPLES: "extractor generations in this step's update batch (logged on update steps)",
    BANK_RETRIEVED_SHARE: "share of the bank's live entries that have been shown to the actor",
    TIME_STEP: "wall seconds of the whole step",
    TIME_ACTOR_ROLLOUT: "wall seconds the actor spent generating rollouts (the critical path)",
    TIME_ACTOR_UPDATE: "wall seconds of the train step (the actor, and the extractor on steps that update "
                       "it), compilation included",
    TIME_EXTRACTOR: "wall seconds of extractor work on the critical path: waiting for the previous "
                    "step's distillation, merging, and distilling in the foreground",
    TIME_EVAL: "wall seconds of evaluation (eval steps only)",
    HOST_RSS: "this host process's resident memory at the end of the step, GB",
    HOST_PEAK_RSS: "the most resident memory the process has had so far, GB",
    HOST_MALLOC_FREE: "memory tcmalloc holds free for reuse (resident, unused), GB; logged only "
                      "where the run preloads tcmalloc (crl_jax/run/host_memory.py)",
}


def host_memory_metrics(usage) -> dict[str, float]:
    """The host-memory scalars of a `host_memory.usage()` reading."""
    out = {HOST_RSS: usage.rss_gb, HOST_PEAK_RSS: usage.peak_rss_gb}
    if usage.malloc_free_gb is not None:
        out[HOST_MALLOC_FREE] = usage.malloc_free_gb
    return out


def _as_float(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    arr = np.asarray(value)  # device arrays and numpy scalars; one host read per value
    real = arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer) or np.issubdtype(
        arr.dtype, np.floating)
    if arr.size != 1 or not real:
        raise ValueError(f"metric {name!r} must be a real scalar, got {type(value).__name__} "
                         f"of shape {arr.shape} and dtype {arr.dtype}")
    return float(arr.reshape(()))


def aggregate_episodes(episodes: Sequence[Mapping[str, object]], prefix: str,
                       task_field: str = "task") -> dict[str, float]:
    """Means of every numeric field over `episodes`, as "<prefix>/<field>" and per task as
    "<prefix>/<field>/<task>", plus "<prefix>/episodes" counts. A field missing from some episodes
    (e.g. tool calls, only in guided ones) is averaged over the episodes that have it."""
    if not episodes:
        return {}
    groups: dict[str | None, list[Mapping[str, object]]] = {None: list(episodes)}
    for ep in episodes:
        if task_field in ep:
            groups.setdefault(str(ep[task_field]), []).append(ep)
    out: dict[str, float] = {}
    for task, eps in groups.items():
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for ep in eps:
            for field, value in ep.items():
                if field == task_field:
                    continue
                sums[field] = sums.get(field, 0.0) + _as_float(field, value)
                counts[field] = counts.get(field, 0) + 1
        for field in sums:
            out[key(prefix, field, task)] = sums[field] / counts[field]
        out[key(prefix, EPISODES, task)] = float(len(eps))
    return out


# The experience service's cumulative counters behind the per-step retrieval metrics.
_COUNTED = ((BANK_RETRIEVALS, "retrievals"), (BANK_RETRIEVAL_HITS, "retrieval_hits"),
            (BANK_REFINEMENTS, "refinements"))


def retrieval_counts(stats: Mapping[str, int]) -> dict[str, int]:
    """The retrieval counters, by metric name; a step's metrics are the difference of two reads.
    Read key by key: a background distillation may be adding other keys meanwhile."""
    return {name: stats[counter] for name, counter in _COUNTED}


def add_counts(metrics: dict, prefix: str, counts: Mapping[str, float]) -> None:
    """Add `counts` into `metrics` as "<prefix>/<key>", summed with any count already there."""
    for k, v in counts.items():
        metrics[f"{prefix}/{k}"] = metrics.get(f"{prefix}/{k}", 0) + v


def bank_metrics(manager) -> dict[str, float]:
    """The bank's live size, and the share of its live entries ever shown to the actor."""
    live = len(manager.store)  # the store holds one text per live bank entry
    with manager.lock:  # the bank functions donate the bank; never read it mid-write
        bank = manager.bank
        shown = int((bank.valid & (bank.retrieval_count > 0)).sum())  # one reduction on device
    return {BANK_SIZE: float(live), BANK_RETRIEVED_SHARE: shown / max(live, 1)}


def _default_enabled() -> bool:
    import jax  # deferred: the report CLI reads key names without starting a backend

    return jax.process_index() == 0


class MetricsWriter:
    """TensorBoard + JSONL scalar writer rooted at `workdir` (`tb/` and `metrics.jsonl`)."""

    JSONL = "metrics.jsonl"
    TB_DIR = "tb"

    def __init__(self, workdir: str, enabled: bool | None = None, fsync: bool = True):
        self.workdir = workdir
        self.enabled = _default_enabled() if enabled is None else bool(enabled)
        self.jsonl_path = os.path.join(workdir, self.JSONL)
        self.tb_dir = os.path.join(workdir, self.TB_DIR)
        self._fsync = fsync
        self._tb = None
        self._purge_step: int | None = None
        self._jsonl = None
        if self.enabled:
            os.makedirs(self.tb_dir, exist_ok=True)

    def resume_from(self, step: int | None) -> int:
        """Prepare for a run restored at `step` (None or -1: starting fresh, nothing restored):
        drop JSONL rows with a later step (and a line torn by a kill), and make TensorBoard hide
        its events after `step`. Call it once at start-up, before the first `write`, whenever the
        workdir may hold logs of an earlier process. Returns the number of JSONL lines dropped."""
        step = -1 if step is None or (isinstance(step, int) and step == -1) else _check_step(step)
        if not self.enabled:
            return 0
        self._close_files()
        self._purge_step = step + 1  # TensorBoard hides events at or after the purge step
        if not os.path.exists(self.jsonl_path):
            return 0
        kept: list[str] = []
        dropped = 0
        with open(self.jsonl_path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                    keep = int(row["step"]) <= step
                except (ValueError, KeyError, TypeError):
                    keep = False  # a line cut short by the kill
                if keep:
                    kept.append(line if line.endswith("\n") else line + "\n")
                else:
                    dropped += 1
        tmp = self.jsonl_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.jsonl_path)  # atomic: a kill here leaves the old or the new file
        return dropped

    def write(self, step: int, scalars: Mapping[str, object]) -> dict:
        """Log `scalars` at `step`; returns the JSONL row (also when disabled, for printing)."""
        step = _check_step(step)
        row: dict = {"step": step, "time": time.time()}
        values = {}
        for name, value in scalars.items():
            if not isinstance(name, str) or not name or name in ("step", "time"):
                raise ValueError(f"metric names must be non-empty strings other than 'step' and "
                                 f"'time', got {name!r}")
            values[name] = _as_float(name, value)
            row[name] = values[name] if math.isfinite(values[name]) else None
        if not self.enabled:
            return row
        if self._jsonl is None:
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        if self._fsync:
            os.fsync(self._jsonl.fileno())
        if self._tb is None:
            # purge_step writes a restart marker so TensorBoard drops the stale events it supersedes.
            self._tb = EventFileWriter(self.tb_dir, purge_step=self._purge_step, fsync=self._fsync)
            self._purge_step = None
        self._tb.add_scalars(step, values, wall_time=row["time"])
        return row

    def _close_files(self):
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def close(self):
        self._close_files()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, (numbers.Integral, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return int(step)


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Status line for long loops: "step 12/100 | elapsed 0:01:05 | ETA 0:07:57 | key v ...".
    `label` names what is counted ("step" for the training loop, episodes for an evaluation).

    On a terminal one line is rewritten in place; otherwise (log files, CI) a line is printed every
    `every` steps and at the last step. The rate is measured from the first `update`, so a resumed
    run and the first step's compilation do not distort the ETA.
    """

    def __init__(self, total: int, keys: Iterable[str] = (), every: int = 10, stream=None,
                 enabled: bool | None = None, clock=time.monotonic, label: str = "step"):
        if total < 1 or every < 1:
            raise ValueError(f"Progress needs total >= 1 and every >= 1, got {total}, {every}")
        self.total, self.keys, self.every = int(total), tuple(keys), int(every)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _default_enabled() if enabled is None else bool(enabled)
        self._clock = clock
        self._t0 = clock()
        self._first: tuple[int, float] | None = None
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0

    def line(self, step: int, scalars: Mapping[str, object] = {}) -> str:
        now = self._clock()
        if self._first is None:
            self._first = (step, now)
        first_step, first_t = self._first
        if step > first_step and step < self.total:
            eta = _hms((now - first_t) / (step - first_step) * (self.total - step))
        else:
            eta = "0:00:00" if step >= self.total else "?"
        parts = [f"{self.label} {step}/{self.total}", f"elapsed {_hms(now - self._t0)}", f"ETA {eta}"]
        for name in self.keys:
            if name in scalars and scalars[name] is not None:
                parts.append(f"{name} {_as_float(name, scalars[name]):.4g}")
        return " | ".join(parts)

    def update(self, step: int, scalars: Mapping[str, object] = {}):
        text = self.line(step, scalars)
        if not self.enabled:
            return
        if self._tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        elif step % self.every == 0 or step >= self.total:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.enabled and self._tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
