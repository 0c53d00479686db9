"""Results of the reproduction grid: reads each run's metrics.jsonl, writes results.md/json and plots.

Owns what the grid reports, per setting (single task, 3-task and 6-task mixtures):
- a table shaped like the paper's Table 1: one row per (method, evaluation mode), one column per
  task plus the average, each cell the final test-split success as mean ± spread over seeds;
- learning curves (training success, evaluation success, actions per episode) with the seed spread;
- actions per episode at the final evaluation;
- actor-rollout seconds per step (`time/actor_rollout_s`) of every method, and its ratio to the
  GRPO baseline.

The spread is the sample standard deviation over seeds (ddof=1; none with a single seed). Only
finished runs enter the tables and plots; a run that is absent, unfinished or failed is listed as
such, and a cell with no finished run reads "missing", never 0. A cell with fewer seeds than asked
for says how many it has, e.g. "0.61 ± 0.04 (2/3)".
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

from crl_jax import config as config_lib
from crl_jax.run import metrics as m
from crl_jax.run.report import load_rows, series

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling modules
import grid_curves  # noqa: E402

# Method name -> (row label in the tables, the variants it adds to the setting's config).
METHODS = {
    "baseline": ("Baseline (GRPO)", ("baseline",)),
    "crl": ("Comp. RL", ()),
    "static": ("Static Online Exp.", ("static",)),
    "exp_only": ("Exp. Only", ("exp_only",)),
}
# Table 1's rows: (method, evaluation prefix, label). The baseline has no bank, so it is evaluated
# without experience; Exp. Only freezes the actor, so only its with-experience score means anything.
TABLE_ROWS = [
    ("baseline", m.EVAL_WITHOUT_EXP, "Baseline (GRPO)"),
    ("static", m.EVAL_WITH_EXP, "Static Online Exp. (eval w/ exp.)"),
    ("static", m.EVAL_WITHOUT_EXP, "Static Online Exp. (eval w/o exp.)"),
    ("exp_only", m.EVAL_WITH_EXP, "Exp. Only"),
    ("crl", m.EVAL_WITH_EXP, "Comp. RL (eval w/ exp.)"),
    ("crl", m.EVAL_WITHOUT_EXP, "Comp. RL (eval w/o exp.)"),
]
MISSING = "missing"
STATUS_FILE = "reproduce_status.json"  # written into a run's workdir after each attempt
# The part of a workdir the tables and plots are built from (~100-150 KB for 20 steps, where the
# checkpoints are hundreds of MB): a folder holding these for a run counts as that run, done.
RECORD_FILES = ("metrics.jsonl", "config.json", "report.md")


@dataclasses.dataclass
class Run:
    """One (setting, method, seed) run of the grid and what its workdir holds."""

    setting: str
    method: str
    seed: int
    workdir: str
    steps: int                    # the step budget of this run
    tasks: tuple[str, ...]
    episodes_per_step: int = 0    # training episodes per step (groups_per_step x group_size)
    state: str = MISSING          # "done", "partial", "failed", "stale" or "missing"
    last_step: int = -1           # last step in its metrics log (-1: none)
    config: dict | None = None    # the run's config as JSON, to tell a stale workdir (None: no check)
    warm_start_identity: dict | None = None  # warm_start.cache_identity: runs with equal ones share it

    @property
    def name(self) -> str:
        return f"{self.setting}/{self.method}/seed{self.seed}"


def read_rows(run: Run) -> list[dict]:
    """The run's logged rows within its step budget (a run logged past it is cut back to it)."""
    path = os.path.join(run.workdir, m.MetricsWriter.JSONL)
    if not os.path.exists(path):
        return []
    rows, _ = load_rows(path)
    return [r for r in rows if int(r["step"]) < run.steps]


# Settings that only the experience extractor reads. A run without experience (memory disabled,
# e.g. the GRPO baseline) builds no extractor, so a change to these leaves its results as they were.
EXTRACTOR_ONLY = ("extractor.", "extractor_model.", "warm_start.extractor_", "warm_start.merge_")


def config_difference(run: Run, finished: bool = False) -> list[str]:
    """The settings in which the workdir's config.json differs from `run.config`, the step budget
    aside (a larger budget resumes a run). A workdir made by another config is stale: its results
    would be someone else's, and the trainer refuses to resume it. With `finished` (the run needs
    no resuming), the extractor's settings are also aside for a run without one, and so is a
    setting added to the code after the run was made, where this config leaves it at its default
    (the default keeps the behaviour the run had)."""
    path = os.path.join(run.workdir, "config.json")
    if run.config is None or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    want, have = flat(run.config), flat(saved)
    inert = ()
    if finished:
        defaults = flat(json.loads(json.dumps(config_lib.to_dict(config_lib.RunConfig()))))
        have = {**{k: v for k, v in defaults.items() if k not in have and k in want}, **have}
        if want.get("memory.enabled") is False and have.get("memory.enabled") is False:
            inert = EXTRACTOR_ONLY  # no extractor in either: its settings cannot change the results
    return sorted(k for k in set(want) | set(have)
                  if k != "steps" and want.get(k) != have.get(k) and not k.startswith(inert))


def run_state(run: Run) -> tuple[str, int]:
    """(state, last logged step). Done means the final step is logged and the trainer wrote its
    report (it does so after the last checkpoint); failed means the last attempt exited non-zero;
    stale means the workdir holds a run of a different config."""
    rows = read_rows(run)
    last = max((int(r["step"]) for r in rows), default=-1)
    if config_difference(run, finished=True):
        return "stale", last
    if last == run.steps - 1 and os.path.exists(os.path.join(run.workdir, "report.md")):
        return "done", last
    if config_difference(run):  # to resume, every setting must match (the checkpoint's digest)
        return "stale", last
    status = os.path.join(run.workdir, STATUS_FILE)
    if os.path.exists(status):
        with open(status, encoding="utf-8") as f:
            if json.load(f).get("returncode", 0) != 0:
                return "failed", last
    started = rows or os.path.isdir(os.path.join(run.workdir, "checkpoints"))
    return ("partial" if started else MISSING), last


def final_eval(rows: list[dict], prefix: str) -> dict[str, float] | None:
    """The last evaluation under `prefix` (success and actions, overall and per task), or None."""
    for row in reversed(rows):
        if row.get(m.key(prefix, m.SUCCESS)) is not None:
            return {k: float(v) for k, v in row.items() if k.startswith(prefix + "/") and v is not None}
    return None


def stats(values: list[float], expected: int) -> dict:
    """Mean and sample standard deviation of per-seed values; n and how many were expected."""
    out = {"n": len(values), "expected": expected, "values": [float(v) for v in values]}
    if values:
        out["mean"] = float(np.mean(values))
        out["std"] = float(np.std(values, ddof=1)) if len(values) > 1 else None
    return out


def cell(s: dict, digits: int = 2) -> str:
    if not s["n"]:
        return MISSING
    text = f"{s['mean']:.{digits}f}"
    if s["std"] is not None:
        text += f" ± {s['std']:.{digits}f}"
    if s["n"] < s["expected"]:
        text += f" ({s['n']}/{s['expected']})"
    return text


def task_value(final: dict, prefix: str, task: str, tasks: tuple[str, ...]) -> float | None:
    """Final success on `task`; a single-task run may have logged only the overall key."""
    value = final.get(m.key(prefix, m.SUCCESS, task))
    if value is None and len(tasks) == 1:
        value = final.get(m.key(prefix, m.SUCCESS))
    return value


def _task_average(evaluation: dict | None, prefix: str, tasks: tuple[str, ...]) -> float | None:
    """Success averaged over `tasks`, or None when the evaluation misses any of them."""
    if evaluation is None:
        return None
    values = [task_value(evaluation, prefix, t, tasks) for t in tasks]
    return None if None in values else float(np.mean(values))


def actor_fingerprint(rows: list[dict]) -> int | None:
    """The fingerprint of the actor's weights that the run started RL from (logged with its first
    step as `warm_start/actor_fingerprint`), or None (no warm start, or a run made before it was
    logged)."""
    value = next((r["warm_start/actor_fingerprint"] for r in rows
                  if r.get("warm_start/actor_fingerprint") is not None), None)
    return None if value is None else int(value)


def _started_apart(row: dict, base: dict, seed: str) -> bool:
    """Whether the two rows' runs of `seed` started RL from different actors. Only runs that both
    logged their actor's fingerprint can tell; runs made before it was logged count as paired."""
    mine, theirs = row["actor_by_seed"].get(seed), base["actor_by_seed"].get(seed)
    return mine is not None and theirs is not None and mine != theirs


def table_rows(runs: list[Run], tasks: tuple[str, ...], seeds: int,
               rows_by_run: dict[str, list[dict]]) -> list[dict]:
    """Table 1's rows for one setting: final success per task and averaged over tasks. The average
    is taken per seed (over the tasks that seed evaluated) and then summarised over seeds. Each
    row also has the same average at the start (the evaluation before the first RL step, i.e.
    after the warm start) and the per-seed change from there to the end."""
    out = []
    methods = {r.method for r in runs}
    for method, prefix, label in TABLE_ROWS:
        if method not in methods:
            continue
        done = [r for r in runs if r.method == method and r.state == "done"]
        evaluations = [(r.seed, final_eval(rows_by_run[r.name], prefix),
                        final_eval(rows_by_run[r.name], f"{m.START}/{prefix}")) for r in done]
        fingerprints = {str(r.seed): fp for r in done
                        if (fp := actor_fingerprint(rows_by_run[r.name])) is not None}
        finals = [f for _, f, _ in evaluations if f is not None]
        per_task = {t: stats([v for f in finals if (v := task_value(f, prefix, t, tasks)) is not None],
                             seeds) for t in tasks}
        # A seed enters the average only if it evaluated every task, so no task is dropped silently.
        ends = {seed: a for seed, f, _ in evaluations
                if (a := _task_average(f, prefix, tasks)) is not None}
        starts = {seed: a for seed, _, st in evaluations
                  if (a := _task_average(st, f"{m.START}/{prefix}", tasks)) is not None}
        actions = [f[m.key(prefix, m.SUCCESS_ACTIONS)] for f in finals if m.key(prefix, m.SUCCESS_ACTIONS) in f]
        out.append({"method": method, "eval": prefix, "label": label, "per_task": per_task,
                    "avg": stats(list(ends.values()), seeds), "actions": stats(actions, seeds),
                    "start": stats(list(starts.values()), seeds),
                    "change": stats([ends[k] - starts[k] for k in ends if k in starts], seeds),
                    "avg_by_seed": {str(k): v for k, v in sorted(ends.items())},
                    "actor_by_seed": fingerprints})
    base = next((r for r in out if r["method"] == "baseline"), None)
    for row in out:
        if base is None or row is base:
            continue
        common = sorted(set(row["avg_by_seed"]) & set(base["avg_by_seed"]))
        apart = [s for s in common if _started_apart(row, base, s)]
        common = [s for s in common if s not in apart]
        diffs = [row["avg_by_seed"][s] - base["avg_by_seed"][s] for s in common]
        row["vs_baseline"] = stats(diffs, seeds)
        base_mean = float(np.mean([base["avg_by_seed"][s] for s in common])) if common else 0.0
        row["vs_baseline"]["relative"] = (float(np.mean(diffs)) / base_mean
                                          if diffs and base_mean > 0 else None)
        row["vs_baseline"]["other_actor_seeds"] = apart
    return out


def rollout_times(runs: list[Run], seeds: int, rows_by_run: dict[str, list[dict]]) -> dict:
    """Per method: actor-rollout seconds per step (per run the median over steps after the first,
    which includes compilation), summarised over seeds, and the ratio of means to the baseline."""
    out = {}
    for method in METHODS:
        per_seed = []
        for r in runs:
            if r.method == method and r.state == "done":
                steps, values = series(rows_by_run[r.name], m.TIME_ACTOR_ROLLOUT)
                values = values[steps >= 1] if (steps >= 1).any() else values
                if len(values):
                    per_seed.append(float(np.median(values)))
        if any(r.method == method for r in runs):
            out[method] = stats(per_seed, seeds)
    base = out.get("baseline", {}).get("mean")
    for s in out.values():
        s["ratio_to_baseline"] = s["mean"] / base if base and s["n"] else None
    return out


def summarise(runs: list[Run], seeds: int | None, out_dir: str) -> dict:
    """Everything results.md and results.json show, per setting; writes the curve PNGs.

    `seeds` is how many seeds a cell is expected to have; None takes it per setting from the seeds
    its runs have (a records folder, where settings were run on different seeds)."""
    results = {"seeds": seeds, "spread": "sample standard deviation over seeds (ddof=1)",
               "settings": {}}
    for setting in dict.fromkeys(r.setting for r in runs):
        group = [r for r in runs if r.setting == setting]
        seed_list = sorted({r.seed for r in group})
        expected = len(seed_list) if seeds is None else seeds
        rows_by_run = {r.name: read_rows(r) if r.state == "done" else [] for r in group}
        tasks = group[0].tasks
        budgets = sorted({r.steps * r.episodes_per_step for r in group})
        png = f"curves_{setting}.png"
        drew = grid_curves.plot_curves(os.path.join(out_dir, png), setting, group, rows_by_run)
        results["settings"][setting] = {
            "tasks": list(tasks),
            "seeds": seed_list,
            "expected_seeds": expected,
            "steps": sorted({r.steps for r in group}),
            "training_episodes_per_run": budgets,
            "table": table_rows(group, tasks, expected, rows_by_run),
            "actor_rollout_s": rollout_times(group, expected, rows_by_run),
            "runs": [{"run": r.name, "state": r.state, "last_step": r.last_step, "steps": r.steps,
                      # relative to the output dir, so results.json can be moved and committed
                      "workdir": os.path.relpath(r.workdir, out_dir)} for r in group],
            "not_in_table": [r.name for r in group if r.state != "done"],
            "curves": png if drew else None,
        }
    return results


START_NOTE = ("Average test success at the start (evaluated after the warm start, before the first "
              "RL step), at the end, and the change per seed (end - start), mean ± spread:")
PAIRED_NOTE = ("Paired with the baseline: per seed, the method's average test success minus the "
               "baseline's on the same seed (both start RL from the same warm-started actor), mean "
               "± spread over seeds; relative = mean difference / the baseline's mean on those seeds:")
ACTIONS_NOTE = ("Actions per successful episode at the final evaluation (`success_actions`; a run "
                "with no success has none):")
ROLLOUT_NOTE = ("Actor rollout seconds per step (`time/actor_rollout_s`; per run the median over the "
                "steps after the first, which compiles; wall time, so only runs made on the same "
                "machine under the same load compare):")


def _setting_markdown(setting: str, s: dict) -> list[str]:
    tasks, budgets = s["tasks"], s["training_episodes_per_run"]
    budget = (f"Budget: {', '.join(map(str, s['steps']))} steps, "
              f"{', '.join(map(str, budgets))} training episodes per run")
    if len(budgets) > 1:
        budget += " (UNEQUAL across the runs of this setting)"
    budget += f"; seeds {', '.join(map(str, s['seeds']))}"
    out = [f"## {setting} ({len(tasks)} task{'s' * (len(tasks) > 1)})", "", budget + ".", "",
           "| Method | " + " | ".join(tasks) + " | Avg |", "|---|" + "---:|" * (len(tasks) + 1)]
    for row in s["table"]:
        cells = [cell(row["per_task"][t]) for t in tasks] + [cell(row["avg"])]
        out.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    out += ["", START_NOTE, "", "| Method | start | end | change |", "|---|---:|---:|---:|"]
    out += [f"| {row['label']} | {cell(row['start'])} | {cell(row['avg'])} | {cell(row['change'])} |"
            for row in s["table"]]
    paired = [row for row in s["table"] if "vs_baseline" in row]
    if paired:
        out += ["", PAIRED_NOTE, "", "| Method | difference | relative |", "|---|---:|---:|"]
        for row in paired:
            d = row["vs_baseline"]
            rel = f"{d['relative']:+.0%}" if d.get("relative") is not None else "—"
            out.append(f"| {row['label']} | {cell(d)} | {rel} |")
        apart = [f"{row['label']} seed {seed}" for row in paired
                 for seed in row["vs_baseline"].get("other_actor_seeds", [])]
        if apart:
            out += ["", "Left out of the pairing, as they started RL from another actor than the "
                    "baseline's of the same seed (by the `warm_start/actor_fingerprint` each "
                    "logged): " + ", ".join(apart) + "."]
    out += ["", ACTIONS_NOTE, "", "| Method | actions |", "|---|---:|"]
    out += [f"| {row['label']} | {cell(row['actions'], 1)} |" for row in s["table"]]
    out += ["", ROLLOUT_NOTE, "", "| Method | s/step | ratio to baseline |", "|---|---:|---:|"]
    for method, t in s["actor_rollout_s"].items():
        ratio = f"{t['ratio_to_baseline']:.2f}x" if t.get("ratio_to_baseline") else "—"
        out.append(f"| {METHODS[method][0]} | {cell(t, 2)} | {ratio} |")
    if s["curves"]:
        out += ["", f"![{setting} learning curves]({s['curves']})"]
    not_done = [r for r in s["runs"] if r["state"] != "done"]
    if not_done:
        listed = [f"`{r['run']}` {r['state']}"
                  + (f" (step {r['last_step'] + 1}/{r['steps']})" if r["last_step"] >= 0 else "")
                  for r in not_done]
        out += ["", f"Not in the table ({len(not_done)} of {len(s['runs'])} runs): "
                + ", ".join(listed) + "."]
    return out + [""]


def render_markdown(results: dict) -> str:
    expected = (f"{results['seeds']}" if results["seeds"] is not None
                else "its setting's seeds (listed under each setting)")
    out = ["# Reproduction of Table 1 (embedded CPU setting)", "",
           f"Final test-split success rate, mean ± spread over seeds; spread = {results['spread']}. "
           f"A cell with fewer finished seeds than {expected} says how many it has as "
           "(finished/expected); a cell with none reads \"missing\".", ""]
    for setting, s in results["settings"].items():
        out += _setting_markdown(setting, s)
    return "\n".join(out).rstrip() + "\n"


def write_results(runs: list[Run], seeds: int | None, out_dir: str) -> dict:
    """Write `<out_dir>/results.md`, `results.json` and `curves_<setting>.png`; returns the results."""
    os.makedirs(out_dir, exist_ok=True)
    results = summarise(runs, seeds, out_dir)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(results))
    return results
