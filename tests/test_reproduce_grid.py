"""experiments/reproduce.py on synthetic runs: which finished warm starts a run reuses, and what
--export keeps (metrics, config and report; warm starts only outside the source tree)."""

import json
import os
import shutil

import numpy as np
import pytest

from crl_jax.run.checkpoint import portable_copy
from tests.reproduce_logs import (PREFIXES, SEEDS, STEPS, TASKS, load_reproduce, rr, table_row,
                                  write_run)


def test_methods_of_one_seed_share_the_warm_start_halves_they_agree_on(tmp_path):
    """On the real single-task configs: every method of a seed (the baseline included) gets a
    finished sibling's actor half; Comp. RL, static and exp. only also its extractor half; another
    seed gets nothing."""
    rp = load_reproduce()
    grid = [run for run, _ in rp.plan({"single": rp.SETTINGS["single"]}, list(rr.METHODS),
                                      [0, 1], None, str(tmp_path))]
    by_name = {(r.method, r.seed): r for r in grid}

    def finish(run, half):
        step = os.path.join(run.workdir, "warm_start", half, "checkpoint", "1")
        os.makedirs(step)
        open(os.path.join(step, "marker"), "w").close()

    def has(run, half):
        return os.path.exists(os.path.join(run.workdir, "warm_start", half, "checkpoint", "1", "marker"))

    baseline, crl = by_name[("baseline", 0)], by_name[("crl", 0)]
    assert rp.describe_warm_start(baseline, grid) == "actor to train"
    assert rp.describe_warm_start(crl, grid) == "actor to train, extractor to train"
    finish(baseline, "actor")
    assert rp.describe_warm_start(crl, grid) == f"actor from {baseline.name}, extractor to train"
    assert rp.describe_warm_start(baseline, grid) == ""  # has what it needs
    assert rp.cache_sources(crl, grid) == [baseline.workdir]
    assert f"--cache_from={baseline.workdir}" in rp.command(crl, "single_task.py", None,
                                                             rp.cache_sources(crl, grid))
    finish(crl, "extractor")
    for method in ("static", "exp_only"):
        run = by_name[(method, 0)]
        assert rp.describe_warm_start(run, grid) == (f"actor from {baseline.name}, "
                                                     f"extractor from {crl.name}")
        assert rp.cache_sources(run, grid) == [baseline.workdir, crl.workdir]
        assert not has(run, "actor")  # the grid copies nothing: the trainer takes them
    assert rp.cache_sources(baseline, grid) == []
    assert rp.cache_sources(by_name[("static", 1)], grid) == []
    assert "--cache_from" not in " ".join(rp.command(baseline, "single_task.py", None, []))


def test_methods_that_differ_only_in_training_share_the_start_evaluation(tmp_path):
    """On the real single-task configs: static and exp. only copy Comp. RL's kept start
    evaluation; the baseline (no bank), another seed, a run with its own and one past its first
    step do not."""
    rp = load_reproduce()
    grid = [run for run, _ in rp.plan({"single": rp.SETTINGS["single"]}, list(rr.METHODS),
                                      [0, 1], None, str(tmp_path))]
    by_name = {(r.method, r.seed): r for r in grid}
    crl = by_name[("crl", 0)]
    assert all(rp.start_eval_source(run, grid) is None for run in grid)  # none played yet
    os.makedirs(crl.workdir)
    with open(os.path.join(crl.workdir, rp.START_EVAL_FILE), "w") as f:
        json.dump({"digest": "d", "metrics": {"eval/without_exp/success": 0.5}}, f)

    for method in ("static", "exp_only"):
        run = by_name[(method, 0)]
        assert rp.start_eval_source(run, grid) is crl
        assert rp.cache_sources(run, grid) == [crl.workdir]
    for name in (("baseline", 0), ("static", 1), ("crl", 1)):
        assert rp.start_eval_source(by_name[name], grid) is None
        assert rp.cache_sources(by_name[name], grid) == []
    has_its_own = by_name[("static", 0)]
    os.makedirs(has_its_own.workdir)
    shutil.copyfile(os.path.join(crl.workdir, rp.START_EVAL_FILE),
                    os.path.join(has_its_own.workdir, rp.START_EVAL_FILE))
    assert rp.start_eval_source(has_its_own, grid) is None
    past_step_0 = by_name[("exp_only", 0)]
    past_step_0.last_step = 0
    assert rp.start_eval_source(past_step_0, grid) is None


def test_export_keeps_the_warm_start_so_a_later_grid_pairs_new_methods(tmp_path):
    """--export keeps each finished run's warm-start halves (checkpoint and curve, not TensorBoard)
    once per seed; a later grid on copies of the records starts an added method from them, and a
    rerun's new warm start replaces its record's."""
    rp = load_reproduce()
    out, dest, later = tmp_path / "grid", tmp_path / "records", tmp_path / "later"
    settings = {"single": rp.SETTINGS["single"]}
    grid = [run for run, _ in rp.plan(settings, list(rr.METHODS), [0], STEPS, str(out))]
    by_method = {r.method: r for r in grid}
    baseline, crl = by_method["baseline"], by_method["crl"]

    def finish_warm_start(run, half, weights):
        folder = os.path.join(run.workdir, "warm_start", half)
        os.makedirs(os.path.join(folder, "checkpoint", "1"))
        os.makedirs(os.path.join(folder, "tb"))
        note = f"Checkpoint commit was successful to {folder}"  # Orbax's, naming the folder
        for name, text in (("checkpoint/1/params", weights), ("checkpoint/1/commit_success.txt", note),
                           ("metrics.jsonl", "{}\n"), ("tb/events", "x")):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)

    rng = np.random.default_rng(9)
    for run in (baseline, crl):
        write_run(run.workdir, rng, PREFIXES[run.method])
    finish_warm_start(baseline, "actor", "actor weights")
    # Comp. RL's trainer took the baseline's actor (--cache_from): a portable copy of it.
    portable_copy(os.path.join(baseline.workdir, "warm_start", "actor", "checkpoint"),
                  os.path.join(crl.workdir, "warm_start", "actor", "checkpoint"))
    finish_warm_start(crl, "extractor", "extractor weights")
    for run in grid:
        run.state, run.last_step = rr.run_state(run)

    assert rp.grid_export.export_warm_starts(grid, str(out), str(dest)) == [
        f"actor of {baseline.name}", f"extractor of {crl.name}"]  # crl's actor is the baseline's
    kept = dest / "single" / "baseline" / "seed0" / "warm_start" / "actor"
    assert sorted(os.listdir(kept)) == ["checkpoint", "metrics.jsonl"]
    assert (kept / "checkpoint" / "1" / "params").read_text() == "actor weights"
    assert sorted(os.listdir(kept / "checkpoint" / "1")) == ["params"]  # no note naming `out`
    assert not (dest / "single" / "crl" / "seed0" / "warm_start" / "actor").exists()
    assert rp.grid_export.export_warm_starts(grid, str(out), str(dest)) == []  # nothing new

    # Another machine: the records copied into a new --out; the static method added there starts
    # from the recorded actor and extractor, not from a retrained one.
    rp.grid_export.export_records(grid, str(out), str(dest))
    shutil.copytree(dest, later)
    again = {r.method: r for r, _ in rp.plan(settings, list(rr.METHODS), [0], STEPS, str(later))}
    assert again["baseline"].state == "done" and again["static"].state == "missing"
    assert rp.describe_warm_start(again["static"], list(again.values())) == (
        "actor from single/baseline/seed0, extractor from single/crl/seed0")
    assert rp.cache_sources(again["static"], list(again.values())) == [
        again["baseline"].workdir, again["crl"].workdir]
    recorded_actor = os.path.join(again["baseline"].workdir, "warm_start", "actor", "checkpoint", "1", "params")
    assert open(recorded_actor).read() == "actor weights"

    # The baseline rerun from a retrained actor: its record's warm start is replaced.
    shutil.rmtree(os.path.join(baseline.workdir, "warm_start"))
    finish_warm_start(baseline, "actor", "retrained actor weights")
    assert rp.grid_export.export_warm_starts([baseline], str(out), str(dest)) == [f"actor of {baseline.name}"]
    assert (kept / "checkpoint" / "1" / "params").read_text() == "retrained actor weights"


def test_export_keeps_an_unfinished_runs_warm_start_but_not_a_stale_ones(tmp_path):
    """A run cut short after its warm start (no RL step logged) still leaves its halves with the
    records, as a record the tables ignore; copied to another machine's --out, the run starts
    again from them. A workdir of another config keeps its warm start to itself."""
    rp = load_reproduce()
    out, dest, later = tmp_path / "grid", tmp_path / "records", tmp_path / "later"
    settings = {"single": rp.SETTINGS["single"]}
    grid = {r.method: r for r, _ in rp.plan(settings, list(rr.METHODS), [0], STEPS, str(out))}
    static = grid["static"]
    for half in ("actor", "extractor"):
        step = os.path.join(static.workdir, "warm_start", half, "checkpoint", "1")
        os.makedirs(step)
        with open(os.path.join(step, "params"), "w") as f:
            f.write(f"{half} weights")
    static.state, static.last_step = rr.run_state(static)
    assert static.state == "missing"  # interrupted before its first RL step

    stale = rp.plan(settings, ["baseline"], [1], STEPS, str(out))[0][0]
    os.makedirs(os.path.join(stale.workdir, "warm_start", "actor", "checkpoint", "1"))
    with open(os.path.join(stale.workdir, "config.json"), "w") as f:
        json.dump({**stale.config, "seed": 99}, f)
    stale.state, stale.last_step = rr.run_state(stale)
    assert stale.state == "stale"

    assert rp.grid_export.export_warm_starts([*grid.values(), stale], str(out), str(dest)) == [
        f"actor of {static.name}", f"extractor of {static.name}"]
    assert not (dest / "single" / "baseline" / "seed1").exists()
    assert rp.grid_export.recorded_runs(str(dest)) == []  # a warm start alone is not a run to tabulate

    shutil.copytree(dest, later)
    again = {r.method: r for r, _ in rp.plan(settings, list(rr.METHODS), [0], STEPS, str(later))}
    assert again["static"].state == "missing"
    assert rp.describe_warm_start(again["static"], list(again.values())) == ""  # it has both
    assert rp.describe_warm_start(again["crl"], list(again.values())) == (
        "actor from single/static/seed0, extractor from single/static/seed0")
    params = os.path.join(again["static"].workdir, "warm_start", "extractor", "checkpoint", "1", "params")
    assert open(params).read() == "extractor weights"


def test_export_folder_must_differ_from_the_output(tmp_path, capsys):
    rp = load_reproduce()
    with pytest.raises(SystemExit):
        rp.parse_args([f"--out={tmp_path}", f"--export={tmp_path}"])
    assert "--export must name another folder" in capsys.readouterr().err
    args = rp.parse_args([f"--out={tmp_path / 'a'}", f"--export={tmp_path / 'b'}"])
    assert args.export == str(tmp_path / "b") and args.warm_starts is None


def test_warm_starts_are_kept_outside_the_source_tree_and_only_with_export(tmp_path, capsys):
    """Warm starts are binary checkpoints: the records in git must not hold them."""
    rp = load_reproduce()
    inside = os.path.join(rp.ROOT, "experiments", "results", "warm")
    for argv, message in (([f"--export={tmp_path / 'b'}", f"--warm-starts={inside}"], "outside the source"),
                          ([f"--warm-starts={tmp_path / 'w'}"], "goes with --export")):
        with pytest.raises(SystemExit):
            rp.parse_args([f"--out={tmp_path / 'a'}", *argv])
        assert message in capsys.readouterr().err
    args = rp.parse_args([f"--out={tmp_path / 'a'}", f"--export={tmp_path / 'b'}",
                          f"--warm-starts={tmp_path / 'w'}"])
    assert args.warm_starts == str(tmp_path / "w")


def _export_table_only(rp, out, dest, only: str, methods: str, seeds: str) -> int:
    """reproduce.py's exit status for `--table-only --export=dest` of the named runs under `out`."""
    return rp.main([f"--out={out}", f"--export={dest}", "--table-only", f"--only={only}",
                    f"--methods={methods}", f"--seeds={seeds}", f"--steps={STEPS}"])


def test_export_tabulates_every_record_the_folder_holds_not_only_this_invocation(tmp_path, capsys):
    """Exporting one run (`--only=single --methods=crl --seeds=0`) must keep the table's other
    records: an earlier machine's seed of another method, another default setting's run. A record
    of a setting this invocation cannot plan is reported and left out."""
    rp = load_reproduce()
    out, dest = tmp_path / "grid", tmp_path / "records"
    rng = np.random.default_rng(3)
    write_run(str(out / "single" / "crl" / "seed0"), rng, PREFIXES["crl"])
    write_run(str(dest / "single" / "baseline" / "seed1"), rng, PREFIXES["baseline"])
    write_run(str(dest / "three" / "crl" / "seed0"), rng, PREFIXES["crl"])
    write_run(str(dest / "custom" / "crl" / "seed0"), rng, PREFIXES["crl"])
    assert _export_table_only(rp, out, dest, "single", "crl", "0") == 0
    assert "custom/crl/seed0" in capsys.readouterr().err
    with open(dest / "results.json") as f:
        results = json.load(f)
    # A cell expects the seeds its own setting has runs of: single has seeds 0 and 1, three only
    # seed 0, so the 3-task cells are complete (not "(1/2)").
    assert results["seeds"] is None
    assert {k: (s["seeds"], s["expected_seeds"]) for k, s in results["settings"].items()} == {
        "single": ([0, 1], 2), "three": ([0], 1)}
    three_row = table_row(results, "crl", "eval/with_exp", setting="three")
    assert {c["expected"] for c in [three_row["avg"], *three_row["per_task"].values()]} == {1}
    with open(dest / "results.md") as f:
        table = f.read()
    assert "(1/2)" not in table.split("## three")[1] and "seeds 0, 1" in table.split("## three")[0]
    runs = {setting: {r["run"]: r["state"] for r in s["runs"]}
            for setting, s in results["settings"].items()}
    assert runs == {"single": {"single/baseline/seed1": "done", "single/crl/seed0": "done"},
                    "three": {"three/crl/seed0": "done"}}
    assert {r["method"] for r in results["settings"]["single"]["table"]} == {"baseline", "crl"}


def test_export_of_one_setting_keeps_the_grids_order_of_settings(tmp_path):
    """Exporting only the 6-task runs must not move their section ahead of the records' single and
    3-task sections (the glob of the records folder is alphabetical: six before three)."""
    rp = load_reproduce()
    out, dest = tmp_path / "grid", tmp_path / "records"
    rng = np.random.default_rng(4)
    write_run(str(out / "six" / "crl" / "seed0"), rng, PREFIXES["crl"])
    write_run(str(dest / "three" / "crl" / "seed0"), rng, PREFIXES["crl"])
    write_run(str(dest / "single" / "crl" / "seed0"), rng, PREFIXES["crl"])
    assert _export_table_only(rp, out, dest, "six", "crl", "0") == 0
    with open(dest / "results.json") as f:
        assert list(json.load(f)["settings"]) == ["single", "three", "six"]
    with open(dest / "results.md") as f:
        sections = [line for line in f if line.startswith("## ")]
    assert [s.split()[1] for s in sections] == ["single", "three", "six"]


def test_export_leaves_out_named_runs_that_never_started_but_keeps_unfinished_ones(tmp_path, capsys):
    """`--seeds=0,1,2` when seed 1 is still running and seed 2 was never started: the records
    expect seeds 0 and 1 (the unfinished one reads "(1/2)" until it is exported again), not 3."""
    rp = load_reproduce()
    out, dest = tmp_path / "grid", tmp_path / "records"
    rng = np.random.default_rng(6)
    write_run(str(out / "six" / "crl" / "seed0"), rng, PREFIXES["crl"])
    write_run(str(out / "six" / "crl" / "seed1"), rng, PREFIXES["crl"])
    os.remove(out / "six" / "crl" / "seed1" / "report.md")  # still running
    assert _export_table_only(rp, out, dest, "six", "crl", "0,1,2") == 0
    printed = capsys.readouterr().out
    assert "never started: six/crl/seed2" in printed and "seed1" not in printed.split("never")[1]
    with open(dest / "results.json") as f:
        six = json.load(f)["settings"]["six"]
    assert (six["seeds"], six["expected_seeds"]) == ([0, 1], 2)
    assert {r["run"]: r["state"] for r in six["runs"]} == {"six/crl/seed0": "done",
                                                          "six/crl/seed1": "missing"}
    assert not os.path.exists(dest / "six" / "crl" / "seed2")


def test_runs_that_started_from_another_actor_are_not_paired(tmp_path):
    """Pairing with the baseline assumes one warm-started actor per seed: a seed whose runs logged
    different actor fingerprints is left out of the paired difference, and said so."""
    rng = np.random.default_rng(5)
    actors = {("baseline", 0): 2 ** 47 + 1, ("crl", 0): 2 ** 47 + 1,     # the same actor
              ("baseline", 1): 11, ("crl", 1): 12,                      # retrained apart
              ("baseline", 2): 21, ("crl", 2): None}                    # not logged: paired
    runs, logged = [], {}
    for (method, seed), actor in actors.items():
        run = rr.Run("three", method, seed, str(tmp_path / method / f"seed{seed}"), STEPS, TASKS,
                     episodes_per_step=16)
        logged[(method, seed)] = write_run(run.workdir, rng, PREFIXES[method], actor)
        run.state, run.last_step = rr.run_state(run)
        runs.append(run)
    results = rr.write_results(runs, SEEDS, str(tmp_path))
    paired = table_row(results, "crl", "eval/without_exp")["vs_baseline"]
    assert paired["other_actor_seeds"] == ["1"] and paired["n"] == 2

    def average(method, seed):
        final = logged[(method, seed)]["final"]["eval/without_exp"]
        return np.mean([final[f"eval/without_exp/success/{t}"] for t in TASKS])

    np.testing.assert_allclose(paired["values"],
                               [average("crl", s) - average("baseline", s) for s in (0, 2)])
    markdown = (tmp_path / "results.md").read_text()
    assert "Left out of the pairing" in markdown and "Comp. RL (eval w/o exp.) seed 1" in markdown

