"""The grid's records: `--export` copies finished runs' records (metrics, config, report) and,
with `--warm-starts`, each setting and seed's warm start, to folders laid out like a grid's
output, so a later grid on another machine pairs the methods it adds with the recorded ones."""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import glob
import os
import shutil
import sys

from crl_jax.run import checkpoint
from crl_jax.warm_start.cache import finished

import reproduce_results as results_lib
from reproduce_results import METHODS, Run


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
    holds copies of these folders starts the methods it adds from them (their trainers take them through --cache_from), so they
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
            if not finished(os.path.join(run.workdir, "warm_start", half, "checkpoint")):
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


def recorded_runs(dest: str) -> list[tuple[str, str, int]]:
    """(setting, method, seed) of every run record under `dest`: `<setting>/<method>/seed<N>/`
    holding a metrics log."""
    found = set()
    for path in glob.glob(os.path.join(glob.escape(dest), "*", "*", "seed*", "metrics.jsonl")):
        setting, method, seed_dir = os.path.relpath(os.path.dirname(path), dest).split(os.sep)
        if method in METHODS and seed_dir[len("seed"):].isdigit():
            found.add((setting, method, int(seed_dir[len("seed"):])))
    return sorted(found)


def export_records(runs: list[Run], out_dir: str, dest: str) -> list[Run]:
    """Copy the record (results_lib.RECORD_FILES) of every finished run of `runs`, whose workdirs lie under
    `out_dir`, to the same relative place under `dest`; return the runs as they stand in `dest`.

    A records folder is itself a grid output: `--table-only` rebuilds its tables, and a later grid
    whose `--out` holds copies of these folders counts the runs as done, so a grid can be extended
    on another machine after its workdirs are gone. A run that is not finished here leaves the
    record already in `dest` (if any) as it is."""
    exported = []
    for run in runs:
        target = os.path.join(dest, os.path.relpath(run.workdir, out_dir))
        if run.state == "done":
            os.makedirs(target, exist_ok=True)
            for name in results_lib.RECORD_FILES:
                if os.path.exists(os.path.join(run.workdir, name)):  # config.json: not on old runs
                    shutil.copyfile(os.path.join(run.workdir, name), os.path.join(target, name))
        copy = dataclasses.replace(run, workdir=target)
        copy.state, copy.last_step = results_lib.run_state(copy)
        exported.append(copy)
    return exported


def export(runs: list[Run], args: argparse.Namespace, plan, settings_known: dict) -> list[Run]:
    """Copy the records of `runs` to `args.export`; return the runs its results cover: these, and
    every other record the folder holds (an earlier machine's seeds, another setting or method),
    planned under `args.export` like a grid's runs (`plan`, the grid's planner; `settings_known`,
    its default settings), in the grid's order of settings. A run named
    here that neither --out nor the folder holds is left out, so that it does not count as an
    expected seed. A record of a setting that is neither named here nor a default one cannot be
    planned (its config is unknown): it is left out, with a warning."""
    exported, never_run = {}, []
    for run, r in zip(runs, export_records(runs, args.out, args.export)):
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
        if setting not in settings and setting not in settings_known:
            print(f"warning: the record {setting}/{method}/seed{seed} in {args.export} is of an "
                  "unknown setting (name it with --setting to tabulate it); left out", file=sys.stderr)
            continue
        spec = settings.setdefault(setting, settings_known.get(setting))
        (run, _), = plan({setting: spec}, [method], [seed], args.steps, args.export)
        exported[(setting, method, seed)] = run
    # The tables keep the grid's order (single, three, six, then settings named by --setting),
    # whichever settings this invocation named and in whatever order.
    in_grid_order = ([s for s in settings_known if s in settings]
                     + [s for s in settings if s not in settings_known])
    order = {name: i for i, name in enumerate(in_grid_order)}
    methods = list(METHODS)
    return sorted(exported.values(),
                  key=lambda r: (order[r.setting], r.seed, methods.index(r.method)))
