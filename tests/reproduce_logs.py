"""Shared by the tests of experiments/reproduce_results.py and experiments/reproduce.py: the two
modules loaded from their files, and synthetic finished runs (metrics.jsonl + report.md)."""

import importlib.util
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "reproduce_results", os.path.join(ROOT, "experiments", "reproduce_results.py"))
rr = importlib.util.module_from_spec(_spec)
sys.modules["reproduce_results"] = rr  # dataclasses look their module up while it executes
_spec.loader.exec_module(rr)

TASKS = ("minihack/room-ultimate-5x5", "shop/v1")
STEPS, SEEDS = 4, 3
PREFIXES = {"baseline": ("eval/without_exp",), "crl": ("eval/with_exp", "eval/without_exp")}


def write_run(workdir, rng, prefixes, actor=None) -> dict:
    """A finished run's metrics.jsonl (evaluations at steps 1 and 3) and report.md; returns the
    values it logged at the final evaluation and its rollout times. `actor`: the fingerprint of
    its warm-started actor, logged with step 0 (None: not logged, as by older runs)."""
    os.makedirs(workdir)
    final, rollout, start = {}, [], {}
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for step in range(STEPS):
            row = {"step": step, "time": 1000.0 + step, "train/success": float(rng.uniform()),
                   "train/actions": float(rng.uniform(2, 8)),
                   "time/actor_rollout_s": float(rng.uniform(1, 2) + 30 * (step == 0))}
            rollout.append(row["time/actor_rollout_s"])
            if step == 0 and actor is not None:
                row["warm_start/actor_fingerprint"] = float(actor)
            if step == 0:  # the evaluation before the first RL step
                for prefix in prefixes:
                    start[prefix] = {t: float(rng.uniform()) for t in TASKS}
                    row.update({f"start/{prefix}/success/{t}": v for t, v in start[prefix].items()})
                    row[f"start/{prefix}/success"] = float(np.mean(list(start[prefix].values())))
            if step in (1, 3):
                for prefix in prefixes:
                    per_task = rng.uniform(size=len(TASKS))
                    row.update({f"{prefix}/success/{t}": float(v) for t, v in zip(TASKS, per_task)})
                    row[f"{prefix}/success"] = float(per_task.mean())
                    row[f"{prefix}/actions"] = float(rng.uniform(3, 9))
                    row[f"{prefix}/success_actions"] = float(rng.uniform(2, 6))
                    if step == STEPS - 1:
                        final[prefix] = row
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 4, "tim')  # a line cut by a kill must not count
    open(os.path.join(workdir, "report.md"), "w").close()
    return {"final": final, "rollout": rollout, "start": start}


def table_row(results, method, prefix, setting="three"):
    return next(r for r in results["settings"][setting]["table"]
                if r["method"] == method and r["eval"] == prefix)


def load_reproduce():
    spec = importlib.util.spec_from_file_location(
        "reproduce", os.path.join(ROOT, "experiments", "reproduce.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
