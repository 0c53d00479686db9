"""Reproduce the paper's comparison on the embedded CPU setting: a resumable grid of training runs.

    python experiments/reproduce.py --out=repro                      # the whole grid, in order
    python experiments/reproduce.py --out=repro --only=single --methods=baseline,crl --seeds=0
    python experiments/reproduce.py --out=repro --dry-run            # list the runs and their state
    python experiments/reproduce.py --out=repro --table-only         # rebuild the results only
    python experiments/reproduce.py --out=repro --table-only --export=experiments/results/records

The grid is settings x seeds x methods. Settings: `single` (single_task.py), `three` and `six`
(multi_task.py:three / :six). Methods: `baseline` (GRPO, no experience), `crl` (Complementary RL),
`static` (static online experience: extractor frozen), `exp_only` (actor frozen). Within a setting
every method has the same steps, tasks per step and rollouts per task, hence the same budget of
training episodes; `--steps=N` overrides the budget of every run.

Each run is `python experiments/run.py --config=<setting>:<variant> --config.seed=S --workdir=<out>/
<setting>/<method>/seed<S>`, one subprocess at a time. The trainer resumes from the newest
checkpoint in its workdir, so an interrupted grid continues where it stopped (a SIGTERM or Ctrl-C
lets the running child keep its current step first, or before RL its warm-start half or start
evaluation; a second one stops it at once); a finished run (its final step logged and its report
written) is skipped, and so, with a warning, is a workdir left by a different config (e.g. after the
configs changed: move it away to rerun it). A failed run is reported and the grid goes on; the exit
status is then 1. After every run `<out>/results.md`, `results.json` and the curve PNGs are rebuilt
(experiments/reproduce_results.py).
`--setting=NAME=CONFIG[:VARIANTS]` (repeatable) replaces the three settings, e.g. to run the grid
on another config file.

`--export=DIR` keeps what the results are made of: each finished run's metrics log, config and
report (not its checkpoints), under the same layout in DIR, and the results there from all the
records DIR holds, so records from earlier machines count alongside new ones (experiments/
grid_export.py). DIR is itself a grid output: `--table-only --out=DIR` rebuilds it.
`--warm-starts=CACHE` (outside the source tree: binary checkpoints) keeps, once per setting and
seed, the warm start each run started from, laid out alike; copying the records and that cache
into a new `--out` lets a later grid add seeds or methods that start from the recorded warm start.

Every method of one setting and seed starts RL from the very same warm-started actor: each run is
given, with the trainer's `--cache_from`, the sibling workdirs holding finished halves it lacks
(`warm_start/actor` from any method of its setting and seed, the baseline included;
`warm_start/extractor` from one whose extractor settings agree too, as
`warm_start.cache_identity` says) and a sibling's kept start evaluation (Comp. RL, static and
exp. only differ only in what they train, so they play the very same test episodes). Retraining
would not give the same weights: XLA's multi-threaded CPU reductions differ in the last bit from
run to run, and a 6-task warm start of one seed has started RL at 0.07, 0.08 and 0.11 test
success that way. The trainer takes each cache only under its own digest (which also covers the
tokenizer's fingerprint), so a wrong source costs time, never correctness.

The child runs share a JAX compilation cache (`<out>/jax_cache` unless JAX_COMPILATION_CACHE_DIR is
set) and default to JAX_PLATFORMS=cpu. Each child's output goes to `<workdir>/run.log`; its progress
lines are echoed here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(_HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, _HERE)

from crl_jax.config import ConfigError, to_dict  # noqa: E402
from crl_jax.run.config_loading import load_config  # noqa: E402
from crl_jax.run.evaluation import START_EVAL_FILE, start_eval_identity  # noqa: E402
from crl_jax.warm_start import cache_identity  # noqa: E402
from crl_jax.warm_start.cache import finished  # noqa: E402

import grid_export  # noqa: E402
from grid_launch import _hms, child_env, command, launch, overrides  # noqa: E402
import reproduce_results as results_lib  # noqa: E402
from reproduce_results import METHODS, Run  # noqa: E402

CONFIG_DIR = os.path.join(_HERE, "configs")
SETTINGS = {"single": "single_task.py", "three": "multi_task.py:three", "six": "multi_task.py:six"}
SEEDS = (0, 1, 2)


def config_spec(setting_spec: str, method: str) -> str:
    """The `--config` value of `method` on a setting: the method's variants after the setting's."""
    path, _, arg = setting_spec.partition(":")
    variants = [v for v in arg.split(",") if v] + list(METHODS[method][1])
    return f"{path}:{','.join(variants)}" if variants else path


def plan(settings: dict[str, str], methods: list[str], seeds: list[int], steps: int | None,
         out: str) -> list[tuple[Run, str]]:
    """Every run of the grid with its config spec, in launch order (setting, seed, method), so a
    partly done grid already compares the methods on the first seeds. Each config is loaded and
    validated here: a bad one stops the grid before any compute."""
    grid, problems = [], []
    for setting, setting_spec in settings.items():
        for seed in seeds:
            for method in methods:
                spec = config_spec(setting_spec, method)
                try:
                    cfg = load_config(spec, overrides(seed, steps), config_dir=CONFIG_DIR)
                except ConfigError as err:
                    problems += [f"{setting}/{method}: {p}" for p in err.problems]
                    continue
                run = Run(setting, method, seed, os.path.join(out, setting, method, f"seed{seed}"),
                          steps=cfg.steps, tasks=tuple(cfg.tasks),
                          episodes_per_step=cfg.rollout.groups_per_step * cfg.rollout.group_size,
                          config=json.loads(json.dumps(to_dict(cfg))),  # tuples as config.json has them
                          warm_start_identity=cache_identity(cfg))
                run.state, run.last_step = results_lib.run_state(run)
                grid.append((run, spec))
    if problems:
        raise ConfigError(problems)
    return grid


def _halves_agree(half: str, mine: dict, other: dict | None) -> bool:
    if other is None:
        return False
    # The extractor's half is trained on the actor's demos: the whole identity must agree.
    return other == mine if half == "extractor" else other["actor"] == mine["actor"]


def warm_start_sources(run: Run, runs: list[Run]) -> dict[str, Run | None]:
    """Each half of a warm start (see crl_jax.warm_start) that `run` needs and its workdir lacks,
    with the sibling run it can be copied from (None: no sibling has it; the run will train it):
    one whose `warm_start.cache_identity` agrees on that half, so the actor's from any method of
    the same setting and seed (the baseline included), the extractor's from one with the same
    extractor too."""
    identity = run.warm_start_identity
    if identity is None:
        return {}
    sources = {}
    for half in ("actor", "extractor"):
        if identity.get(half) is None or os.path.exists(os.path.join(run.workdir, "warm_start", half)):
            continue
        sources[half] = next((other for other in runs if other.workdir != run.workdir
                              and _halves_agree(half, identity, other.warm_start_identity)
                              and finished(os.path.join(other.workdir, "warm_start", half,
                                                        "checkpoint"))), None)
    return sources


def start_eval_source(run: Run, runs: list[Run]) -> Run | None:
    """The sibling whose kept start evaluation `run` can use: one whose config differs from the
    run's in training-only settings alone (crl_jax.run.evaluation.start_eval_identity) and that has
    played it. None when the run has one, is past it, or no sibling qualifies."""
    mine = os.path.join(run.workdir, START_EVAL_FILE)
    if run.last_step >= 0 or os.path.exists(mine):
        return None
    identity = start_eval_identity(run.config)
    return next((other for other in runs if other.workdir != run.workdir
                 and os.path.exists(os.path.join(other.workdir, START_EVAL_FILE))
                 and start_eval_identity(other.config) == identity), None)


def cache_sources(run: Run, runs: list[Run]) -> list[str]:
    """The sibling workdirs `run` takes its warm-start halves (warm_start_sources) and start
    evaluation (start_eval_source) from, for the trainer's --cache_from: the trainer takes each
    only under its own digest, so a wrong source costs time, never correctness."""
    found = [other for other in warm_start_sources(run, runs).values() if other is not None]
    found.append(start_eval_source(run, runs))
    return list(dict.fromkeys(other.workdir for other in found if other is not None))


def describe_warm_start(run: Run, runs: list[Run]) -> str:
    """What a run still to start will do about its warm start, for --dry-run: "actor from
    three/baseline/seed3", "extractor to train", or "" when its workdir has every half it needs."""
    return ", ".join(f"{half} from {other.name}" if other is not None else f"{half} to train"
                     for half, other in warm_start_sources(run, runs).items())


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python experiments/reproduce.py",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="repro",
                   help="output dir: one workdir per run, results.md/json, PNGs")
    p.add_argument("--only", help=f"comma-separated settings (default: all of {','.join(SETTINGS)})")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated, of " + ",".join(METHODS))
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated integers")
    p.add_argument("--steps", type=int, help="step budget of every run (default: the configs')")
    p.add_argument("--setting", action="append", metavar="NAME=CONFIG[:VARIANTS]",
                   help="replace the default settings (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state; run nothing")
    p.add_argument("--table-only", action="store_true", help="rebuild results from what exists")
    p.add_argument("--export", metavar="DIR",
                   help="copy finished runs' records (metrics, config, report) to DIR and write "
                        "the results there from all the records DIR holds")
    p.add_argument("--warm-starts", metavar="CACHE",
                   help="with --export: keep every run's finished warm start (checkpoints) in "
                        "CACHE, a folder outside the source tree, laid out like DIR")
    args = p.parse_args(argv)
    _check_args(p, args)
    return args


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Validate and normalise the parsed flags (p.error on a bad one)."""
    settings = dict(SETTINGS)
    if args.setting:
        settings = {}
        for item in args.setting:
            name, sep, spec = item.partition("=")
            if not sep or not name or not spec:
                p.error(f"--setting expects NAME=CONFIG[:VARIANTS], got {item!r}")
            path, colon, variants = spec.partition(":")
            if os.path.isfile(path):  # the runs start in the repository root, not here
                spec = os.path.abspath(path) + colon + variants
            settings[name] = spec
    if args.only:
        unknown = [s for s in _csv(args.only) if s not in settings]
        if unknown:
            p.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(settings)}")
        settings = {s: settings[s] for s in _csv(args.only)}
    args.settings = settings
    args.methods = _csv(args.methods)
    unknown = [x for x in args.methods if x not in METHODS]
    if unknown or not args.methods:
        p.error(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                f"known: {', '.join(METHODS)}")
    try:
        args.seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        p.error(f"--seeds expects comma-separated integers, got {args.seeds!r}")
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        p.error("--seeds needs at least one seed and no repeats")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    args.out = os.path.abspath(args.out)
    if args.export is not None:
        args.export = os.path.abspath(args.export)
        if args.export == args.out:
            p.error("--export must name another folder than --out")
    if args.warm_starts is not None:
        args.warm_starts = os.path.abspath(args.warm_starts)
        if args.export is None:
            p.error("--warm-starts goes with --export")
        if os.path.commonpath([args.warm_starts, ROOT]) == ROOT:
            p.error(f"--warm-starts must be outside the source tree ({ROOT}): warm starts are "
                    "binary checkpoints that the commands regenerate")


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # a terminated grid also ends the training run it started


def dry_run(grid, siblings: list[Run], steps: int | None) -> None:
    """List the runs, their state and command, and where their caches would come from."""
    for i, (run, spec) in enumerate(grid, 1):
        where = f" step {run.last_step + 1}/{run.steps}" if run.last_step >= 0 else ""
        todo = run.state != "done"
        print(f"[{i}/{len(grid)}] {run.name:<28} {run.state:<8}{where:<14} "
              f"{' '.join(command(run, spec, steps, cache_sources(run, siblings) if todo else [])[1:])}")
        warm_start = describe_warm_start(run, siblings) if todo else ""
        if warm_start:
            print(f"{'':>8}warm start: {warm_start}")
        start_eval = start_eval_source(run, siblings) if todo else None
        if start_eval is not None:
            print(f"{'':>8}start evaluation: from {start_eval.name}, if played after the same warm start")
    done = sum(r.state == "done" for r, _ in grid)
    print(f"{done} of {len(grid)} runs done, {len(grid) - done} to run")


def run_grid(grid, runs: list[Run], siblings: list[Run], args: argparse.Namespace) -> list[str]:
    """Run every unfinished run of `grid`, one at a time; returns the names of those that did
    not finish."""
    env, started, failed = child_env(args.out), time.monotonic(), []
    for i, (run, spec) in enumerate(grid, 1):
        tag = f"[{i}/{len(grid)}] {run.name}"
        if run.state == "done":
            print(f"{tag}: done, skipped", flush=True)
            continue
        if run.state == "stale":
            print(f"{tag}: its workdir holds a run of another config (differs in "
                  f"{', '.join(results_lib.config_difference(run)[:5])}); move or delete "
                  f"{run.workdir} to run it again. Skipped.", flush=True)
            failed.append(run.name)
            continue
        resume = f", resuming after step {run.last_step}" if run.last_step >= 0 else ""
        print(f"{tag}: starting ({run.steps} steps{resume}) | "
              f"elapsed {_hms(time.monotonic() - started)}", flush=True)
        sources = cache_sources(run, siblings)
        if sources:
            print(f"{tag}: warm start and start evaluation may come from "
                  f"{', '.join(os.path.relpath(s, args.out) for s in sources)}", flush=True)
        t0 = time.monotonic()
        rc = launch(run, spec, args.steps, env, sources)
        run.state, run.last_step = results_lib.run_state(run)
        if rc != 0 or run.state != "done":
            failed.append(run.name)
        print(f"{tag}: {run.state} in {_hms(time.monotonic() - t0)} | elapsed "
              f"{_hms(time.monotonic() - started)}", flush=True)
        results_lib.write_results(runs, len(args.seeds), args.out)
    return failed


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        grid = plan(args.settings, args.methods, args.seeds, args.steps, args.out)
    except ConfigError as err:
        for problem in err.problems:
            print(f"config error: {problem}", file=sys.stderr)
        return 2
    runs = [run for run, _ in grid]
    # Warm starts are shared with every method's run of the same setting and seed under --out,
    # not only the ones selected now: a grid completed in pieces still pairs them.
    siblings = runs if set(args.methods) == set(METHODS) or args.table_only else [
        run for run, _ in plan(args.settings, list(METHODS), args.seeds, args.steps, args.out)]
    if args.dry_run:
        dry_run(grid, siblings, args.steps)
        return 0
    failed = [] if args.table_only else run_grid(grid, runs, siblings, args)
    results_lib.write_results(runs, len(args.seeds), args.out)
    print(f"results: {os.path.join(args.out, 'results.md')}")
    if args.export:
        records = grid_export.export(runs, args, plan, SETTINGS)
        results_lib.write_results(records, None, args.export)  # seeds counted per setting
        held = sum(r.state == "done" for r in records)
        print(f"records of {held} of {len(records)} runs in {args.export}; "
              f"results: {os.path.join(args.export, 'results.md')}")
    if failed:
        print(f"{len(failed)} run(s) did not finish: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("grid interrupted; the same command continues it", file=sys.stderr)
        sys.exit(130)
