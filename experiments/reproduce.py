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

`--export=DIR` keeps what the results are made of: it copies each finished run's metrics log,
config and report (not its checkpoints) to the same place under DIR and writes the results there
from the runs of this invocation and every other run record DIR holds
(`<setting>/<method>/seed<N>/metrics.jsonl`, of a setting named here or a default one), so
records from earlier machines or sessions count alongside the new ones, whatever `--only`,
`--methods` and `--seeds` say. DIR is itself a grid output: `--table-only --out=DIR` rebuilds it.
`--warm-starts=CACHE` (outside the source tree: they are binary checkpoints) keeps, once per
setting and seed, the warm start each run started from (export_warm_starts; an unfinished run's
too) under the same layout; copying the records and that cache into a new `--out` lets a later
grid add seeds or methods without rerunning them, the added methods starting from the recorded
warm start (share_warm_start) on any machine.

Every method of one setting and seed starts RL from the same warm-started actor (the warm start
does not depend on how a run uses experience), and the grid makes sure it is the very same one:
before a run starts, each finished half of a sibling's warm start that it lacks is copied into its
workdir, `warm_start/actor` from any method of the same setting and seed (the baseline included),
`warm_start/extractor` from one whose extractor settings agree too (Comp. RL, static, exp. only),
as `warm_start.cache_identity` says, the function the trainer keys each half on. Retraining
would not give the same weights: XLA's multi-threaded CPU reductions differ in the last bit from
run to run, and a 6-task warm start of one seed has started RL at 0.07, 0.08 and 0.11 test
success that way. The trainer still checks each half's digest (which also covers the built
tokenizer's fingerprint) and recomputes on a mismatch, so a wrong copy costs time, never
correctness. The evaluation before the first RL step is shared the same way
(share_start_evaluation): Comp. RL, static and exp. only differ only in what they train, so from
one warm start they play the very same test episodes, and a sibling's kept result is copied; the
trainer uses it only under the same config (training switches aside) and warm start.

The child runs share a JAX compilation cache (`<out>/jax_cache` unless JAX_COMPILATION_CACHE_DIR is
set) and default to JAX_PLATFORMS=cpu. Each child's output goes to `<workdir>/run.log`; its progress
lines are echoed here.
"""

from __future__ import annotations

import argparse
import collections
import filecmp
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(_HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, _HERE)

from crl_jax.run import checkpoint  # noqa: E402
from crl_jax.config import ConfigError, to_dict  # noqa: E402
from crl_jax.run.config_loading import load_config  # noqa: E402
from crl_jax.run.evaluation import START_EVAL_FILE, start_eval_identity  # noqa: E402
from crl_jax.warm_start import cache_identity  # noqa: E402

import reproduce_results as results_lib  # noqa: E402
from reproduce_results import METHODS, STATUS_FILE, Run  # noqa: E402

RUN = os.path.join(_HERE, "run.py")
CONFIG_DIR = os.path.join(_HERE, "configs")
SETTINGS = {"single": "single_task.py", "three": "multi_task.py:three", "six": "multi_task.py:six"}
SEEDS = (0, 1, 2)
ECHO = ("step ", "restored checkpoint", "Traceback", "Error", "error:")  # child lines shown live
TAIL_LINES = 30


def config_spec(setting_spec: str, method: str) -> str:
    """The `--config` value of `method` on a setting: the method's variants after the setting's."""
    path, _, arg = setting_spec.partition(":")
    variants = [v for v in arg.split(",") if v] + list(METHODS[method][1])
    return f"{path}:{','.join(variants)}" if variants else path


def overrides(seed: int, steps: int | None) -> list[str]:
    return [f"seed={seed}"] + ([f"steps={steps}"] if steps is not None else [])


def command(run: Run, spec: str, steps: int | None) -> list[str]:
    return ([sys.executable, RUN, f"--config={spec}"]
            + [f"--config.{o}" for o in overrides(run.seed, steps)] + [f"--workdir={run.workdir}"])


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


def _warm_start_done(workdir: str, half: str) -> bool:
    checkpoint = os.path.join(workdir, "warm_start", half, "checkpoint")
    return os.path.isdir(checkpoint) and any(n.isdigit() for n in os.listdir(checkpoint))


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
                              and _warm_start_done(other.workdir, half)), None)
    return sources


def share_warm_start(run: Run, runs: list[Run]) -> list[str]:
    """Copy each warm-start half that `run` lacks from its sibling (warm_start_sources). Returns
    "<half> from <run>" per half copied."""
    copied = []
    for half, other in warm_start_sources(run, runs).items():
        if other is not None:
            shutil.copytree(os.path.join(other.workdir, "warm_start", half),
                            os.path.join(run.workdir, "warm_start", half))
            copied.append(f"{half} from {other.name}")
    return copied


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


def share_start_evaluation(run: Run, runs: list[Run]) -> str:
    """Copy a sibling's start evaluation into `run`'s workdir (start_eval_source). The trainer
    uses it only if it was played after the same warm start (its digest covers the warm start's
    metrics) and plays its own otherwise, so a wrong copy costs time, never correctness. Returns
    the sibling's name, or ""."""
    other = start_eval_source(run, runs)
    if other is None:
        return ""
    os.makedirs(run.workdir, exist_ok=True)
    shutil.copyfile(os.path.join(other.workdir, START_EVAL_FILE), os.path.join(run.workdir, START_EVAL_FILE))
    return other.name


def describe_warm_start(run: Run, runs: list[Run]) -> str:
    """What a run still to start will do about its warm start, for --dry-run: "actor from
    three/baseline/seed3", "extractor to train", or "" when its workdir has every half it needs."""
    return ", ".join(f"{half} from {other.name}" if other is not None else f"{half} to train"
                     for half, other in warm_start_sources(run, runs).items())


def _same_checkpoint(a: str, b: str) -> bool:
    """Whether two checkpoint folders hold the same relative files with the same bytes, leaving
    out Orbax's commit notes (a portable copy has none)."""
    def files(root):
        return sorted(os.path.relpath(os.path.join(folder, name), root)
                      for folder, _, names in os.walk(root) for name in names
                      if name != checkpoint.COMMIT_NOTE)
    names = files(a)
    return names == files(b) and all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False)
                                     for n in names)


def export_warm_starts(runs: list[Run], out_dir: str, dest: str) -> list[str]:
    """Keep, in the cache `dest` laid out like the records, the warm start of each run of `runs`:
    its finished halves' checkpoint (params, digest, summary; as a portable copy) and training
    curve (not their TensorBoard copy) go to `<run's record>/warm_start/<half>`, once per setting and seed (a half
    equal to one a sibling's record already holds is not copied again). A later grid whose `--out`
    holds copies of these folders starts the methods it adds from them (share_warm_start), so they
    pair with the recorded ones even on another machine, where retraining the warm start would give
    another actor. Runs not finished count too (their record is then the warm start alone, which
    the tables ignore): a seed whose first run is cut short on one machine continues on another
    from the same actor. A stale run's warm start (another config's) is not kept. Returns "<half> of
    <run>" per half copied."""
    copied = []
    for run in runs:
        if run.state == "stale":
            continue
        record = os.path.join(dest, os.path.relpath(run.workdir, out_dir))
        for half in ("actor", "extractor"):
            if not _warm_start_done(run.workdir, half):
                continue
            source = os.path.join(run.workdir, "warm_start", half)
            kept = glob.glob(os.path.join(glob.escape(os.path.dirname(os.path.dirname(record))), "*",
                                          os.path.basename(record), "warm_start", half, "checkpoint"))
            if any(_same_checkpoint(os.path.join(source, "checkpoint"), k) for k in kept):
                continue
            target = os.path.join(record, "warm_start", half)
            shutil.rmtree(target, ignore_errors=True)  # a rerun replaces its record's warm start
            # Without Orbax's commit notes, which name this machine's folder.
            checkpoint.portable_copy(os.path.join(source, "checkpoint"), os.path.join(target, "checkpoint"))
            if os.path.exists(os.path.join(source, "metrics.jsonl")):
                shutil.copyfile(os.path.join(source, "metrics.jsonl"), os.path.join(target, "metrics.jsonl"))
            copied.append(f"{half} of {run.name}")
    return copied


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def launch(run: Run, spec: str, steps: int | None, env: dict) -> int:
    """Run one training subprocess to its end; its output goes to run.log, progress lines here."""
    os.makedirs(run.workdir, exist_ok=True)
    cmd = command(run, spec, steps)
    tail = collections.deque(maxlen=TAIL_LINES)
    # Line-buffered, so `tail -f run.log` follows a running child.
    with open(os.path.join(run.workdir, "run.log"), "a", encoding="utf-8", buffering=1) as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)

        def follow() -> int:
            for line in process.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if any(marker in line for marker in ECHO):
                    print(f"    {run.name}: {line.rstrip()}", flush=True)
            return process.wait()

        try:
            rc = follow()
        except KeyboardInterrupt:
            # The trainer finishes its current step (or warm-start half, or start evaluation),
            # keeps it and exits (graceful_stop); its output is still drained meanwhile, so it
            # never blocks on a full pipe.
            print(f"    {run.name}: stopping after its current step, which is checkpointed (before "
                  "RL: after its warm-start half or start evaluation; interrupt again to stop it "
                  "at once)", flush=True)
            process.terminate()
            try:
                follow()
            except KeyboardInterrupt:
                process.kill()
                process.wait()
            raise
    with open(os.path.join(run.workdir, STATUS_FILE), "w", encoding="utf-8") as f:
        json.dump({"command": cmd, "returncode": rc, "time": time.time()}, f)
    if rc != 0:
        print(f"    {run.name}: exited with status {rc}; last lines of its run.log:", flush=True)
        for line in tail:
            print(f"      {line}", flush=True)
    return rc


def child_env(out: str) -> dict:
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(out, "jax_cache"))
    env["PYTHONUNBUFFERED"] = "1"  # progress lines arrive as they are printed
    return env


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
    return args


def recorded_runs(dest: str) -> list[tuple[str, str, int]]:
    """(setting, method, seed) of every run record under `dest`: `<setting>/<method>/seed<N>/`
    holding a metrics log."""
    found = set()
    for path in glob.glob(os.path.join(glob.escape(dest), "*", "*", "seed*", "metrics.jsonl")):
        setting, method, seed_dir = os.path.relpath(os.path.dirname(path), dest).split(os.sep)
        if method in METHODS and seed_dir[len("seed"):].isdigit():
            found.add((setting, method, int(seed_dir[len("seed"):])))
    return sorted(found)


def export(runs: list[Run], args: argparse.Namespace) -> list[Run]:
    """Copy the records of `runs` to `args.export`; return the runs its results cover: these, and
    every other record the folder holds (an earlier machine's seeds, another setting or method),
    planned under `args.export` like a grid's runs, in the grid's order of settings. A run named
    here that neither --out nor the folder holds is left out, so that it does not count as an
    expected seed. A record of a setting that is neither named here nor a default one cannot be
    planned (its config is unknown): it is left out, with a warning."""
    exported, never_run = {}, []
    for run, r in zip(runs, results_lib.export_records(runs, args.out, args.export)):
        # A run named here that was never started (nothing under --out, no record in the folder)
        # would count as an expected seed of its setting in the folder's tables: cells would read
        # "(3/5)" for two seeds run nowhere. An unfinished run still counts.
        if run.state == results_lib.MISSING and r.state == results_lib.MISSING:
            never_run.append(r.name)
        else:
            exported[(r.setting, r.method, r.seed)] = r
    if never_run:
        print(f"not in the records, never started: {', '.join(never_run)}", flush=True)
    kept = export_warm_starts(runs, args.out, args.warm_starts) if args.warm_starts else []
    if kept:
        print(f"warm starts kept in {args.warm_starts}: {', '.join(kept)}", flush=True)
    settings = dict(args.settings)
    for setting, method, seed in recorded_runs(args.export):
        if (setting, method, seed) in exported:
            continue
        if setting not in settings and setting not in SETTINGS:
            print(f"warning: the record {setting}/{method}/seed{seed} in {args.export} is of an "
                  "unknown setting (name it with --setting to tabulate it); left out", file=sys.stderr)
            continue
        spec = settings.setdefault(setting, SETTINGS.get(setting))
        (run, _), = plan({setting: spec}, [method], [seed], args.steps, args.export)
        exported[(setting, method, seed)] = run
    # The tables keep the grid's order (single, three, six, then settings named by --setting),
    # whichever settings this invocation named and in whatever order.
    in_grid_order = [s for s in SETTINGS if s in settings] + [s for s in settings if s not in SETTINGS]
    order = {name: i for i, name in enumerate(in_grid_order)}
    methods = list(METHODS)
    return sorted(exported.values(),
                  key=lambda r: (order[r.setting], r.seed, methods.index(r.method)))


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # a terminated grid also ends the training run it started


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
        for i, (run, spec) in enumerate(grid, 1):
            where = f" step {run.last_step + 1}/{run.steps}" if run.last_step >= 0 else ""
            print(f"[{i}/{len(grid)}] {run.name:<28} {run.state:<8}{where:<14} "
                  f"{' '.join(command(run, spec, args.steps)[1:])}")
            warm_start = describe_warm_start(run, siblings) if run.state != "done" else ""
            if warm_start:
                print(f"{'':>8}warm start: {warm_start}")
            start_eval = start_eval_source(run, siblings) if run.state != "done" else None
            if start_eval is not None:
                print(f"{'':>8}start evaluation: from {start_eval.name}, if played after the "
                      f"same warm start")
        todo = sum(r.state != "done" for r in runs)
        print(f"{len(grid) - todo} of {len(grid)} runs done, {todo} to run")
        return 0
    if not args.table_only:
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
            copied = share_warm_start(run, siblings)
            if copied:
                print(f"{tag}: warm start copied: {', '.join(copied)}", flush=True)
            start_eval = share_start_evaluation(run, siblings)
            if start_eval:
                print(f"{tag}: start evaluation copied from {start_eval} (used if played after the "
                      f"same warm start)", flush=True)
            t0 = time.monotonic()
            rc = launch(run, spec, args.steps, env)
            run.state, run.last_step = results_lib.run_state(run)
            if rc != 0 or run.state != "done":
                failed.append(run.name)
            print(f"{tag}: {run.state} in {_hms(time.monotonic() - t0)} | elapsed "
                  f"{_hms(time.monotonic() - started)}", flush=True)
            results_lib.write_results(runs, len(args.seeds), args.out)
    results_lib.write_results(runs, len(args.seeds), args.out)
    print(f"results: {os.path.join(args.out, 'results.md')}")
    if args.export:
        records = export(runs, args)
        results_lib.write_results(records, None, args.export)  # seeds counted per setting
        held = sum(r.state == "done" for r in records)
        print(f"records of {held} of {len(records)} runs in {args.export}; "
              f"results: {os.path.join(args.export, 'results.md')}")
    if not args.table_only and failed:
        print(f"{len(failed)} run(s) did not finish: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("grid interrupted; the same command continues it", file=sys.stderr)
        sys.exit(130)
