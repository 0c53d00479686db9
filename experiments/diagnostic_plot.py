"""Plot the diagnostic comparison (docs/diagnostic.md): success and bank precision over training,
per method (mean over seeds), with the drifts marked, and the paired per-seed differences.

    python experiments/reproduce.py --out=diag --setting=diagnostic=diagnostic.py --seeds=0,1,2
    python experiments/diagnostic_plot.py --out=diag

Reads `<out>/diagnostic/<method>/seed<S>/metrics.jsonl`; writes `<out>/diagnostic.png` and prints
one JSON line: per method the mean test success with experience (without, for GRPO) after the
first drift, and Comp. RL minus GRPO and minus static, paired per seed (mean and standard error).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from crl_jax.envs.doors import DRIFT_EVERY  # noqa: E402

METHODS = ("baseline", "crl", "static", "exp_only")
COLORS = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def curve(log: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in log if key in r}


def after_first_drift(log: list[dict], method: str) -> float:
    """Mean test success of the evaluations after the first drift: with experience, except GRPO."""
    key = "eval/without_exp/success" if method == "baseline" else "eval/with_exp/success"
    values = [v for step, v in curve(log, key).items() if step >= DRIFT_EVERY]
    return float(np.mean(values)) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the grid's output folder")
    args = p.parse_args()
    logs = {m: {os.path.basename(os.path.dirname(f)): rows(f) for f in sorted(glob.glob(
        os.path.join(args.out, "diagnostic", m, "seed*", "metrics.jsonl")))} for m in METHODS}
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=100)
    FigureCanvasAgg(fig)
    panels = [("train/success", "training success"), ("bank/precision", "bank precision")]
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        for method, runs in logs.items():
            curves = [curve(log, key) for log in runs.values()]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if steps:
                ax.plot(steps, [np.mean([c[s] for c in curves]) for s in steps], label=method,
                        color=COLORS[method])
        for drift in range(DRIFT_EVERY, 1 + max((r["step"] for runs in logs.values()
                                                   for log in runs.values() for r in log), default=0),
                           DRIFT_EVERY):
            ax.axvline(drift, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{title} (mean over seeds; dotted: drifts)")
        ax.set_xlabel("RL step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "diagnostic.png"))
    after = {m: {seed: after_first_drift(log, m) for seed, log in runs.items()} for m, runs in logs.items()}
    out = {"after_first_drift": {m: float(np.mean(list(v.values()))) if v else None for m, v in after.items()}}
    for other in ("baseline", "static"):
        seeds = sorted(set(after["crl"]) & set(after[other]))
        diffs = np.array([after["crl"][s] - after[other][s] for s in seeds])
        out[f"crl_minus_{other}"] = {
            "seeds": seeds, "mean": float(diffs.mean()) if len(diffs) else None,
            "se": float(diffs.std(ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
