"""The grid's learning curves: per setting, training success, evaluation success and actions per
episode over steps, each method's seed mean with its spread (experiments/reproduce_results.py)."""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from crl_jax.run import metrics as m
from crl_jax.run.report import series

import reproduce_results as rr  # the grid's Run and METHODS; imported here at call time

CURVE_DPI = 80


def _smooth(values: np.ndarray) -> np.ndarray:
    """Moving average over a twentieth of the run (none for short runs), edges kept."""
    w = len(values) // 20
    if w < 2:
        return values
    padded = np.concatenate([np.full(w // 2, values[0]), values, np.full(w - 1 - w // 2, values[-1])])
    return np.convolve(padded, np.ones(w) / w, mode="valid")


def seed_curves(runs: list[rr.Run], rows_by_run: dict[str, list[dict]], name: str, smooth: bool,
                from_step: int = 0, with_start: bool = False):
    """(steps, mean, std, n) of metric `name` over the finished runs, on the steps they all logged.
    `with_start` adds the run's `start/<name>` (logged before the first RL step) at step -1."""
    curves = []
    for r in runs:
        steps, values = series(rows_by_run[r.name], name)
        steps, values = steps[steps >= from_step], values[steps >= from_step]
        if len(steps):
            curve = dict(zip(steps.tolist(), (_smooth(values) if smooth else values).tolist()))
            if with_start:
                _, start = series(rows_by_run[r.name], f"{m.START}/{name}")
                if len(start):
                    curve[-1] = float(start[0])
            curves.append(curve)
    if not curves:
        return None
    common = sorted(set.intersection(*(set(c) for c in curves)))
    if not common:
        return None
    data = np.array([[c[s] for s in common] for c in curves])
    std = data.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(common))
    return np.array(common), data.mean(axis=0), std, len(curves)


def plot_curves(path: str, setting: str, runs: list[rr.Run], rows_by_run: dict[str, list[dict]]) -> bool:
    """Learning curves of one setting, mean over seeds with a ± one standard deviation band."""
    # (title, [(metric, label suffix, smoothed, first step drawn)]); step 0 of the rollout time
    # includes compilation and would flatten the rest.
    panels = [("Training success", [(m.TRAIN_SUCCESS, "", True, 0)]),
              ("Test success (-1: before RL; solid: w/ exp., dashed: w/o)",
               [(m.EVAL_WITH_EXP_SUCCESS, "w/ exp.", False, 0),
                (m.EVAL_WITHOUT_EXP_SUCCESS, "w/o exp.", False, 0)]),
              ("Actions per training episode", [(m.TRAIN_ACTIONS, "", True, 0)]),
              ("Actor rollout s/step (after step 0)", [(m.TIME_ACTOR_ROLLOUT, "", False, 1)])]
    fig = Figure(figsize=(14, 3.4), dpi=CURVE_DPI)
    FigureCanvasAgg(fig)
    drew = False
    colors = dict(zip(rr.METHODS, ("tab:gray", "tab:blue", "tab:orange", "tab:purple")))
    for i, (title, keys) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for method, (label, _) in rr.METHODS.items():
            done = [r for r in runs if r.method == method and r.state == "done"]
            for name, suffix, smooth, from_step in keys:
                curve = seed_curves(done, rows_by_run, name, smooth, from_step,
                                    with_start=name.startswith("eval/"))
                if curve is None:
                    continue
                steps, mean, std, n = curve
                style = "--" if suffix == "w/o exp." else "-"
                ax.plot(steps, mean, style, color=colors[method],
                        marker="o" if len(steps) < 30 else None,
                        markersize=3, label=f"{label} {suffix} (n={n})".replace("  ", " "))
                ax.fill_between(steps, mean - std, mean + std, color=colors[method], alpha=0.15)
                drew = True
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left")  # "best" is slow with seed bands
    if drew:
        fig.suptitle(f"{setting}: mean over seeds, band ± 1 std", fontsize=10)
        fig.tight_layout()
        fig.savefig(path)
    return drew
