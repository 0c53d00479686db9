"""What a run records of its episodes: per-episode records aggregated into metrics, and the sample
episodes written to `WORKDIR/samples.jsonl` (what the actor actually writes, which curves do not
show)."""

from __future__ import annotations

import json
import os

import numpy as np

from crl_jax.run import metrics as metrics_lib


def episode_record(traj) -> dict:
    # A field present only in successful episodes is averaged over those (see aggregate_episodes).
    extra = {metrics_lib.SUCCESS_ACTIONS: float(traj.actions)} if traj.success else {}
    return {**extra, "task": traj.spec.task, metrics_lib.SUCCESS: float(traj.success),
            metrics_lib.REWARD: traj.reward, metrics_lib.ACTIONS: float(traj.actions),
            metrics_lib.TOOL_CALLS: float(traj.tool_calls),
            "invalid_actions": float(traj.invalid_actions),
            "env_errors": float(traj.end_reason.startswith("env_error"))}


def episode_metrics(trajectories, prefix: str) -> dict[str, float]:
    """Success, reward, actions and tool use, overall and per task (see crl_jax.run.metrics)."""
    return metrics_lib.aggregate_episodes([episode_record(t) for t in trajectories], prefix)


def step_episode_metrics(trajectories) -> dict[str, float]:
    """A training step's episode metrics: all episodes, the guided and the experience-free ones,
    and the guided episodes' search-and-ask rate."""
    guided = [t for t in trajectories if t.spec.guided]
    out = episode_metrics(trajectories, metrics_lib.TRAIN)
    out.update(episode_metrics(guided, metrics_lib.TRAIN_WITH_EXP))
    out.update(episode_metrics([t for t in trajectories if not t.spec.guided],
                               metrics_lib.TRAIN_WITHOUT_EXP))
    out[metrics_lib.TOOL_CALL_RATE] = float(np.mean([t.tool_calls for t in guided] or [0.0]))
    return out


def sample_episodes(trajectories, per_kind: int = 1) -> list[dict]:
    """The first experience-free and the first experience-guided episode of a step as text (the
    actor's turns and the final outcome)."""
    picked = ([t for t in trajectories if not t.spec.guided][:per_kind]
              + [t for t in trajectories if t.spec.guided][:per_kind])
    return [{"task": t.spec.task, "seed": t.spec.seed, "guided": t.spec.guided, "entry_id": t.entry_id,
             "success": t.success, "end": t.end_reason,
             "actor": [m["content"] for m in t.messages if m["role"] == "assistant"]}
            for t in picked]


class SamplesLog:
    """WORKDIR/samples.jsonl, one line per step: its sample episodes and the extractor outputs kept
    meanwhile. Only process 0 writes; a resumed run first drops the lines it will replay."""

    def __init__(self, workdir: str, start_step: int, writes: bool):
        self.path, self.writes = os.path.join(workdir, "samples.jsonl"), writes
        if writes:
            keep_samples_before(self.path, start_step)

    def append(self, step: int, episodes: list[dict], extractor: list[dict] | None) -> None:
        sample = {"step": step, "episodes": episodes}
        if extractor is not None:
            sample["extractor"] = extractor
        if self.writes:
            with open(self.path, "a") as f:
                f.write(json.dumps(sample) + "\n")


def keep_samples_before(path: str, step: int) -> None:
    """Drop the sample lines of steps >= `step` (a resumed run replays them) and any line torn by
    a crash, so samples.jsonl holds each step once."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["step"] < step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    with open(path, "w") as f:
        f.writelines(kept)
