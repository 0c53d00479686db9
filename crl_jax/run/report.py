"""End-of-run report: reads `<workdir>/metrics.jsonl` and writes `<workdir>/report.md` with PNG plots.

Owns the choice of what a run's summary shows: a table of first vs last values of the key metrics,
evaluation episode counts, the last evaluation per task, and plots over steps of success rate,
reward, actions per episode, bank size, extractor reward, tool-call rate and step timings. A plot
or row appears only when its metrics were logged, so baselines without a bank or extractor still
get a clean report. Usable after a crash too: `python -m crl_jax.run.report <workdir>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from crl_jax.run import metrics as m

REPORT = "report.md"

# (file, title, y label, keys drawn on it). Eval keys are sparse, so they get markers.
PLOTS = [
    ("success.png", "Success rate", "success rate",
     [m.TRAIN_SUCCESS, m.TRAIN_WITH_EXP_SUCCESS, m.TRAIN_WITHOUT_EXP_SUCCESS,
      m.EVAL_WITH_EXP_SUCCESS, m.EVAL_WITHOUT_EXP_SUCCESS]),
    ("reward.png", "Episode reward", "mean reward",
     [m.TRAIN_REWARD, m.key(m.TRAIN_WITH_EXP, m.REWARD), m.key(m.TRAIN_WITHOUT_EXP, m.REWARD),
      m.key(m.EVAL_WITH_EXP, m.REWARD), m.key(m.EVAL_WITHOUT_EXP, m.REWARD)]),
    ("actions.png", "Actions per episode", "actions",
     [m.TRAIN_ACTIONS, m.EVAL_WITH_EXP_ACTIONS, m.EVAL_WITHOUT_EXP_ACTIONS]),
    ("bank_size.png", "Experience bank size", "entries", [m.BANK_SIZE]),
    ("bank_precision.png", "Bank precision (drifting tasks)", "share of live entries", [m.BANK_PRECISION]),
    ("extractor_reward.png", "Extractor reward", "mean reward", [m.EXTRACTOR_REWARD]),
    ("tool_call_rate.png", "search_and_ask calls per guided episode", "calls", [m.TOOL_CALL_RATE]),
    ("timing.png", "Step timing", "seconds",
     [m.TIME_STEP, m.TIME_ACTOR_ROLLOUT, m.TIME_ACTOR_UPDATE, m.TIME_EXTRACTOR]),
]

SUMMARY_KEYS = [
    m.TRAIN_SUCCESS, m.TRAIN_WITH_EXP_SUCCESS, m.TRAIN_WITHOUT_EXP_SUCCESS,
    m.EVAL_WITH_EXP_SUCCESS, m.EVAL_WITHOUT_EXP_SUCCESS, m.TRAIN_REWARD, m.TRAIN_ACTIONS,
    m.EVAL_WITH_EXP_ACTIONS, m.EVAL_WITHOUT_EXP_ACTIONS, m.TOOL_CALL_RATE, m.BANK_SIZE,
    m.EXTRACTOR_REWARD, m.TIME_ACTOR_ROLLOUT, m.TIME_STEP,
]


def load_rows(path: str) -> tuple[list[dict], int]:
    """The JSONL rows that parse, and how many lines did not (a crash can cut the last one)."""
    rows, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                int(row["step"])
                rows.append(row)
            except (ValueError, KeyError, TypeError):
                bad += 1
    return rows, bad


def series(rows: list[dict], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric, sorted by step; nulls skipped, a repeated step keeps the last."""
    by_step = {int(r["step"]): float(r[name]) for r in rows if r.get(name) is not None}
    steps = np.array(sorted(by_step), dtype=np.int64)
    return steps, np.array([by_step[s] for s in steps], dtype=np.float64)


def eval_series(rows: list[dict], name: str) -> tuple[np.ndarray, np.ndarray]:
    """`series` of an evaluation metric, with the evaluation before the first RL step (logged as
    "start/<name>" in the first row) drawn at step -1."""
    steps, values = series(rows, name)
    start_steps, start_values = series(rows, f"{m.START}/{name}")
    if len(start_steps):
        steps = np.concatenate([[-1], steps])
        values = np.concatenate([[start_values[0]], values])
    return steps, values


def _sum(rows: list[dict], name: str) -> float:
    return float(sum(float(r[name]) for r in rows if r.get(name) is not None))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _plot(path: str, title: str, ylabel: str, lines: list[tuple[str, np.ndarray, np.ndarray]]):
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, steps, values in lines:
        # Sparse series (evaluations, extractor updates) get markers; dense per-step ones are noisy,
        # so they are drawn faint under a moving average.
        sparse = label.startswith("eval/") or len(steps) < 40
        if not sparse:
            line, = ax.plot(steps, values, alpha=0.3, linewidth=0.8)
            w = len(steps) // 20
            smooth = np.convolve(values, np.ones(w) / w, mode="valid")
            ax.plot(steps[w - 1:], smooth, color=line.get_color(), label=f"{label} (mean of {w})")
        else:
            ax.plot(steps, values, label=label, marker="o", markersize=4)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def _per_task(rows: list[dict]) -> tuple[list[str], dict[str, float]]:
    """Tasks seen in eval per-task keys, and the last logged value of each such key."""
    prefixes = [m.key(p, f) + "/" for p in (m.EVAL_WITH_EXP, m.EVAL_WITHOUT_EXP)
                for f in (m.SUCCESS, m.ACTIONS)]
    last: dict[str, float] = {}
    tasks: list[str] = []
    for row in rows:
        for name, value in row.items():
            for prefix in prefixes:
                if name.startswith(prefix) and value is not None:
                    last[name] = float(value)
                    task = name[len(prefix):]
                    if task not in tasks:
                        tasks.append(task)
    return tasks, last


def write_report(workdir: str) -> str:
    """Write report.md and its plots into `workdir`; returns the report's path."""
    path = os.path.join(workdir, m.MetricsWriter.JSONL)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics log at {path}: nothing to report")
    rows, bad = load_rows(path)
    out = ["# Training report", ""]
    if not rows:
        out += ["The metrics log holds no complete rows yet.", ""]
    else:
        steps = [int(r["step"]) for r in rows]
        times = [float(r["time"]) for r in rows if r.get("time") is not None]
        span = f", {(max(times) - min(times)) / 60:.1f} min of wall time" if times else ""
        out += [f"Steps {min(steps)} to {max(steps)} ({len(rows)} logged rows{span})."]
        if bad:
            out += [f"{bad} unreadable line(s) in the log were skipped."]
        out += ["", "## Summary", "",
                "| metric | first step | first | last step | last | points |",
                "|---|---:|---:|---:|---:|---:|"]
        for name in SUMMARY_KEYS:
            s, v = series(rows, name)
            if len(s):
                out.append(f"| `{name}` | {s[0]} | {_fmt(v[0])} | {s[-1]} | {_fmt(v[-1])} | {len(s)} |")
        evals = {p: series(rows, m.key(p, m.EPISODES)) for p in (m.EVAL_WITH_EXP, m.EVAL_WITHOUT_EXP)}
        counted = [f"{p}: {int(v.sum())} over {len(s)} evaluations"
                   for p, (s, v) in evals.items() if len(s)]
        if counted:
            out += ["", "Evaluation episodes: " + ", ".join(counted) + "."]
        out += (_before_after(rows) + _coevolution_section(rows, _read_config(workdir))
                + _bank_section(rows) + _warm_start_section(rows))
        tasks, last = _per_task(rows)
        if tasks:
            cols = [m.key(p, f) for f in (m.SUCCESS, m.ACTIONS)
                    for p in (m.EVAL_WITH_EXP, m.EVAL_WITHOUT_EXP)]
            out += ["", "## Last evaluation per task", "",
                    "| task | " + " | ".join(f"`{c}`" for c in cols) + " |",
                    "|---|" + "---:|" * len(cols)]
            for task in tasks:
                cells = [_fmt(last[f"{c}/{task}"]) if f"{c}/{task}" in last else "" for c in cols]
                out.append(f"| {task} | " + " | ".join(cells) + " |")
        out += ["", "## Plots", ""]
        for fname, title, ylabel, names in PLOTS:
            lines = [(n, *(eval_series(rows, n) if n.startswith("eval/") else series(rows, n)))
                     for n in names]
            lines = [line for line in lines if len(line[1])]
            if lines:
                _plot(os.path.join(workdir, fname), title, ylabel, lines)
                out += [f"![{title}]({fname})", ""]
    report = os.path.join(workdir, REPORT)
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(out).rstrip() + "\n")
    return report


def _before_after(rows: list[dict]) -> list[str]:
    """Test-split evaluation before the first RL step (after any warm start) against the last."""
    out = []
    for prefix in (m.EVAL_WITHOUT_EXP, m.EVAL_WITH_EXP):
        start = {f: series(rows, f"{m.START}/{m.key(prefix, f)}") for f in (m.SUCCESS, m.ACTIONS, m.EPISODES)}
        end = {f: series(rows, m.key(prefix, f)) for f in (m.SUCCESS, m.ACTIONS, m.EPISODES)}
        if not len(start[m.SUCCESS][0]) or not len(end[m.SUCCESS][0]):
            continue
        cell = lambda d, f, i: _fmt(d[f][1][i]) if len(d[f][0]) else ""  # noqa: E731
        out.append(f"| `{prefix}` | {cell(start, m.SUCCESS, 0)} | {cell(start, m.ACTIONS, 0)} | "
                   f"{cell(start, m.EPISODES, 0)} | {end[m.SUCCESS][0][-1]} | {cell(end, m.SUCCESS, -1)} | "
                   f"{cell(end, m.ACTIONS, -1)} | {cell(end, m.EPISODES, -1)} | "
                   f"{_change(start, end)} |")
    if not out:
        return []
    return ["", "## Test split before and after RL", "",
            "Before: after the warm start, before the first RL step. Success rate, actions per "
            "episode and number of test episodes. Change: after minus before, with its standard "
            "error (binomial, the two evaluations taken as independent).", "",
            "| evaluation | success before | actions before | episodes | last step | success after "
            "| actions after | episodes | change ± s.e. |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|", *out]


def _change(start: dict, end: dict) -> str:
    """Success after minus before, ± the standard error of that difference."""
    if not (len(start[m.EPISODES][0]) and len(end[m.EPISODES][0])):
        return ""
    (p0, n0), (p1, n1) = ((d[m.SUCCESS][1][i], d[m.EPISODES][1][i]) for d, i in ((start, 0), (end, -1)))
    if n0 < 1 or n1 < 1:
        return ""
    se = float(np.sqrt(p0 * (1 - p0) / n0 + p1 * (1 - p1) / n1))
    return f"{p1 - p0:+.3f} ± {se:.3f}"


def _read_config(workdir: str) -> dict:
    try:
        with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


_WARM_START_LINES = (
    ("actor_window_loss", "actor behaviour-cloning loss on action windows, end of that phase"),
    ("extractor_loss", "extractor SFT loss at the end"),
    ("extractor_parsed", "extractor distillations that parse, on fresh scripted episodes"),
    ("extractor_parsed_with_lesson",
     "the same, each shown a lesson of its family (as every distillation in RL)"),
    ("extractor_merge_parsed", "extractor merges that parse, on fresh chunks of lessons"),
)


def _coevolution_section(rows: list[dict], config: dict) -> list[str]:
    """How much the two models co-evolved: extractor updates against RL steps, what each update
    trained on, and how the bank moved per step. Warns when the extractor trained on fewer than a
    quarter of the RL steps of a run that asked it to train."""
    if not len(series(rows, m.TRAIN_SUCCESS)[0]) or not len(series(rows, m.BANK_SIZE)[0]):
        return []
    # RL steps: those after the memory warm-up (the steps that retrieve and can train).
    warmup = config.get("memory", {}).get("warmup_steps", 0)
    steps = sum(1 for r in rows if m.TRAIN_SUCCESS in r and r.get("step", 0) >= warmup)
    updates = len(series(rows, m.EXTRACTOR_LOSS)[0])
    samples = series(rows, m.EXTRACTOR_SAMPLES)[1]
    lines = [f"- extractor updates: {updates} of {steps} RL steps"
             + (f", {samples.mean():.1f} generations per update" if len(samples) else "")]
    per_step = {name: _sum(rows, key) / max(steps, 1) for name, key in (
        ("added", m.BANK_ADDED), ("updated", m.BANK_UPDATED), ("merged away", m.BANK_MERGED),
        ("evicted", m.BANK_EVICTED))}
    lines.append("- bank entries per RL step: " + ", ".join(f"{k} {v:.2f}" for k, v in per_step.items()))
    share = series(rows, m.BANK_RETRIEVED_SHARE)[1]
    if len(share):
        lines.append(f"- share of live entries shown to the actor at least once, at the end: {share[-1]:.2f}")
    precision = series(rows, m.BANK_PRECISION)[1]
    if len(precision):
        lines.append(f"- bank precision (share of live entries stating a fact true at that step): "
                     f"{precision[0]:.2f} first, {precision.max():.2f} at most, {precision[-1]:.2f} last")
    wants_training = config.get("extractor", {}).get("train", True) and config.get(
        "memory", {}).get("enabled", True)
    if wants_training and updates < steps / 4:
        lines.append(f"- **warning: the extractor was updated on {updates} of {steps} RL steps, fewer "
                     "than a quarter: the extractor barely co-evolved with the actor in this run**")
    return ["", "## Co-evolution", "", *lines]


def _bank_section(rows: list[dict]) -> list[str]:
    size_steps, sizes = series(rows, m.BANK_SIZE)
    if not len(size_steps):
        return []
    lines = [f"- live entries at the end: {int(sizes[-1])} (largest: {int(sizes.max())})"]
    written = _sum(rows, "distill/entries_written")
    reasons = {k[len("distill/"):]: _sum(rows, k) for k in sorted({k for r in rows for k in r})
               if k.startswith("distill/") and k != "distill/entries_written"}
    if reasons:
        total = sum(reasons.values())
        lines.append(f"- distillation outputs: {int(total)}; entries written: {int(written)}; by outcome: "
                     + ", ".join(f"{k} {int(v)}" for k, v in reasons.items() if v))
    retrievals, hits = _sum(rows, m.BANK_RETRIEVALS), _sum(rows, m.BANK_RETRIEVAL_HITS)
    if retrievals:
        lines.append(f"- retrievals for guided training episodes: {int(retrievals)}, of which "
                     f"{int(hits)} injected an entry; search_and_ask refinements: "
                     f"{int(_sum(rows, m.BANK_REFINEMENTS))}")
    merges = _sum(rows, "bank/merge_calls")
    if merges:
        prefix = "bank/merge_outcome/"
        outcomes = {k[len(prefix):]: _sum(rows, k) for k in sorted({k for r in rows for k in r})
                    if k.startswith(prefix)}
        lines.append(f"- merge calls: {int(merges)}"
                     + (" (by outcome: " + ", ".join(f"{k} {int(v)}" for k, v in outcomes.items() if v) + ")"
                        if outcomes else "")
                     + f"; entries merged away: {int(_sum(rows, 'bank/merge_removed'))}, written: "
                       f"{int(_sum(rows, 'bank/merge_written'))}")
    return ["", "## Experience bank", "", *lines]


def _warm_start_section(rows: list[dict]) -> list[str]:
    first = next((r for r in rows if r.get("warm_start/actor_loss") is not None), None)
    if first is None:
        return []
    lines = [f"- scripted demonstrations: success {_fmt(first.get('warm_start/demo_success', 0.0))}",
             f"- actor behaviour-cloning loss at the end: {_fmt(first['warm_start/actor_loss'])}"]
    for key, text in _WARM_START_LINES:  # each only where the warm start logged it
        if first.get(f"warm_start/{key}") is not None:
            lines.append(f"- {text}: {_fmt(first[f'warm_start/{key}'])}")
    if first.get("warm_start/actor_fingerprint") is not None:
        lines.append("- fingerprint of the actor's weights after it (runs with equal ones start RL "
                     f"from the same actor): {int(first['warm_start/actor_fingerprint']):012x}")
    lines.append(f"- wall time: {_fmt(first.get('warm_start/time_s', 0.0))} s (curves: "
                 "warm_start/{actor,extractor}/metrics.jsonl and TensorBoard)")
    return ["", "## Warm start", "", *lines]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crl_jax.run.report",
                                     description="Write report.md and plots from a run's metrics.")
    parser.add_argument("workdir", help="the run's workdir (holds metrics.jsonl)")
    args = parser.parse_args(argv)
    try:
        print(write_report(args.workdir))
    except (FileNotFoundError, OSError) as e:
        print(f"crl_jax.run.report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
