"""experiments/reproduce_results.py on synthetic metrics logs: Table 1 cells against numpy, missing
runs reported as missing (never as zeros), rollout-time ratio, curves written."""

import importlib.util
import json
import os
import shutil
import sys

import numpy as np
import pytest

from crl_jax.config import WarmStartConfig
from crl_jax.run.checkpoint import portable_copy

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


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("grid")
    rng = np.random.default_rng(0)
    logged, runs = {}, []
    for method in ("baseline", "crl", "static"):
        for seed in range(SEEDS):
            run = rr.Run("three", method, seed, str(tmp_path / method / f"seed{seed}"), STEPS, TASKS,
                         episodes_per_step=16)
            if method == "crl" and seed == 2:
                pass  # the missing run
            elif method == "static":
                pass  # a method with no run at all
            else:
                logged[run.name] = write_run(run.workdir, rng, PREFIXES[method])
            run.state, run.last_step = rr.run_state(run)
            runs.append(run)
    results = rr.write_results(runs, SEEDS, str(tmp_path))
    return tmp_path, logged, results


def _row(results, method, prefix, setting="three"):
    return next(r for r in results["settings"][setting]["table"]
                if r["method"] == method and r["eval"] == prefix)


@pytest.mark.parametrize("method,prefix,seeds", [("baseline", "eval/without_exp", (0, 1, 2)),
                                                 ("crl", "eval/with_exp", (0, 1)),
                                                 ("crl", "eval/without_exp", (0, 1))])
def test_table_cells_match_numpy(grid, method, prefix, seeds):
    _, logged, results = grid
    row = _row(results, method, prefix)
    finals = [logged[f"three/{method}/seed{s}"]["final"][prefix] for s in seeds]
    for task in TASKS:
        values = np.array([f[f"{prefix}/success/{task}"] for f in finals])
        cell = row["per_task"][task]
        assert cell["n"] == len(seeds) and cell["expected"] == SEEDS
        np.testing.assert_allclose(cell["mean"], values.mean())
        np.testing.assert_allclose(cell["std"], values.std(ddof=1))
    per_seed_avg = np.array([np.mean([f[f"{prefix}/success/{t}"] for t in TASKS]) for f in finals])
    np.testing.assert_allclose(row["avg"]["mean"], per_seed_avg.mean())
    np.testing.assert_allclose(row["avg"]["std"], per_seed_avg.std(ddof=1))
    actions = np.array([f[f"{prefix}/success_actions"] for f in finals])
    np.testing.assert_allclose(row["actions"]["mean"], actions.mean())
    starts = np.array([np.mean(list(logged[f"three/{method}/seed{s}"]["start"][prefix].values()))
                       for s in seeds])
    np.testing.assert_allclose(row["start"]["mean"], starts.mean())
    np.testing.assert_allclose(row["change"]["mean"], (per_seed_avg - starts).mean())
    np.testing.assert_allclose(row["change"]["std"], (per_seed_avg - starts).std(ddof=1))
    if method != "baseline":  # paired by seed with the baseline, on the seeds both finished
        base = np.array([np.mean([logged[f"three/baseline/seed{s}"]["final"]["eval/without_exp"]
                                  [f"eval/without_exp/success/{t}"] for t in TASKS]) for s in seeds])
        diff = row["vs_baseline"]
        assert diff["n"] == len(seeds)
        np.testing.assert_allclose(diff["mean"], (per_seed_avg - base).mean())
        np.testing.assert_allclose(diff["std"], (per_seed_avg - base).std(ddof=1))
        np.testing.assert_allclose(diff["relative"], (per_seed_avg - base).mean() / base.mean())
    else:
        assert "vs_baseline" not in row


def test_missing_runs_are_reported_as_missing_not_zero(grid):
    out, _, results = grid
    setting = results["settings"]["three"]
    states = {r["run"]: r["state"] for r in setting["runs"]}
    assert states["three/crl/seed2"] == "missing" and states["three/crl/seed0"] == "done"
    assert "three/crl/seed2" in setting["not_in_table"]
    assert "three/baseline/seed0" not in setting["not_in_table"]
    static = _row(results, "static", "eval/with_exp")
    assert static["per_task"][TASKS[0]]["n"] == 0 and "mean" not in static["per_task"][TASKS[0]]
    md = open(out / "results.md").read()
    assert "| Static Online Exp. (eval w/ exp.) | missing | missing | missing |" in md
    crl = _row(results, "crl", "eval/with_exp")
    expected = rr.cell(crl["per_task"][TASKS[0]])
    assert expected.endswith("(2/3)") and f"| Comp. RL (eval w/ exp.) | {expected} |" in md
    assert "`three/crl/seed2` missing" in md


def test_rollout_time_ratio_and_curves(grid):
    out, logged, results = grid
    times = results["settings"]["three"]["actor_rollout_s"]

    def medians(method, seeds):  # step 0 (compilation) is left out
        return np.array([np.median(logged[f"three/{method}/seed{s}"]["rollout"][1:]) for s in seeds])

    base, crl = medians("baseline", range(3)), medians("crl", range(2))
    np.testing.assert_allclose(times["baseline"]["mean"], base.mean())
    np.testing.assert_allclose(times["crl"]["std"], crl.std(ddof=1))
    np.testing.assert_allclose(times["crl"]["ratio_to_baseline"], crl.mean() / base.mean())
    assert times["static"]["n"] == 0 and times["static"]["ratio_to_baseline"] is None
    png = out / results["settings"]["three"]["curves"]
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 300_000
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results))


def test_unfinished_run_is_partial_and_stays_out_of_the_table(tmp_path):
    run = rr.Run("single", "crl", 0, str(tmp_path / "r"), STEPS, TASKS[:1])
    write_run(run.workdir, np.random.default_rng(1), PREFIXES["crl"])
    os.remove(os.path.join(run.workdir, "report.md"))  # killed before the trainer's end
    assert rr.run_state(run) == ("partial", STEPS - 1)
    run.steps = STEPS + 2  # a larger budget asked for later: resumable, not done
    run.state, run.last_step = rr.run_state(run)
    assert run.state == "partial"
    results = rr.write_results([run], 1, str(tmp_path))
    assert _row(results, "crl", "eval/with_exp", "single")["avg"]["n"] == 0
    with open(os.path.join(run.workdir, rr.STATUS_FILE), "w") as f:
        json.dump({"returncode": 1}, f)
    assert rr.run_state(run)[0] == "failed"


def test_workdir_of_another_config_is_stale_but_a_larger_budget_is_not(tmp_path):
    run = rr.Run("single", "crl", 0, str(tmp_path / "r"), STEPS, TASKS[:1])
    write_run(run.workdir, np.random.default_rng(2), PREFIXES["crl"])
    saved = {"steps": STEPS, "seed": 0, "memory": {"enabled": True, "merge_every": 5}}
    with open(os.path.join(run.workdir, "config.json"), "w") as f:
        json.dump(saved, f)
    run.config = json.loads(json.dumps(saved))
    assert rr.run_state(run)[0] == "done"
    run.config["steps"] = STEPS + 5
    assert rr.config_difference(run) == []
    run.config["memory"]["merge_every"] = 0
    run.config["memory"]["new_key"] = 1
    assert rr.config_difference(run) == ["memory.merge_every", "memory.new_key"]
    assert rr.run_state(run)[0] == "stale"


def test_extractor_settings_do_not_make_a_run_without_experience_stale(tmp_path):
    run = rr.Run("six", "baseline", 1, str(tmp_path / "r"), STEPS, TASKS[:1])
    write_run(run.workdir, np.random.default_rng(3), PREFIXES["baseline"])
    saved = {"steps": STEPS, "memory": {"enabled": False, "capacity": 10},
             "extractor": {"max_new_tokens": 384}, "warm_start": {"extractor_steps": 120, "episodes": 8}}
    with open(os.path.join(run.workdir, "config.json"), "w") as f:
        json.dump(saved, f)
    run.config = json.loads(json.dumps(saved))
    run.config["warm_start"]["extractor_steps"] = 480
    run.config["extractor"]["max_new_tokens"] = 256
    assert rr.config_difference(run, finished=True) == []
    assert rr.run_state(run)[0] == "done"
    # An unfinished one would be resumed, and the trainer resumes only the very same config.
    assert rr.config_difference(run) == ["extractor.max_new_tokens", "warm_start.extractor_steps"]
    os.remove(os.path.join(run.workdir, "report.md"))
    assert rr.run_state(run)[0] == "stale"
    run.config["warm_start"]["episodes"] = 16      # the actor's warm start: does change it
    run.config["memory"]["capacity"] = 20          # memory settings other than the extractor's
    assert rr.config_difference(run, finished=True) == ["memory.capacity", "warm_start.episodes"]
    run.config["warm_start"]["episodes"] = 8
    run.config["memory"].update(enabled=True, capacity=10)  # with an extractor they count
    assert rr.config_difference(run, finished=True) == ["extractor.max_new_tokens", "memory.enabled",
                                                        "warm_start.extractor_steps"]


def test_a_setting_added_later_at_its_default_does_not_make_a_finished_run_stale(tmp_path):
    run = rr.Run("six", "crl", 1, str(tmp_path / "r"), STEPS, TASKS[:1])
    write_run(run.workdir, np.random.default_rng(4), PREFIXES["crl"])
    saved = {"steps": STEPS, "memory": {"enabled": True}, "warm_start": {"merge_examples": 16}}
    with open(os.path.join(run.workdir, "config.json"), "w") as f:
        json.dump(saved, f)
    run.config = json.loads(json.dumps(saved))
    run.config["warm_start"]["merge_lessons"] = WarmStartConfig().merge_lessons  # made before it existed
    assert rr.config_difference(run, finished=True) == []
    assert rr.run_state(run)[0] == "done"
    assert rr.config_difference(run) == ["warm_start.merge_lessons"]  # resuming needs the same config
    run.config["warm_start"]["merge_lessons"] = WarmStartConfig().merge_lessons + 1  # another behaviour
    assert rr.config_difference(run, finished=True) == ["warm_start.merge_lessons"]
    assert rr.run_state(run)[0] == "stale"


def test_results_json_names_workdirs_relative_to_the_output(grid):
    tmp_path, _, results = grid
    runs = results["settings"]["three"]["runs"]
    assert runs[0]["workdir"] == os.path.join("baseline", "seed0")
    assert all(not os.path.isabs(r["workdir"]) for r in runs)
    assert json.load(open(tmp_path / "results.json"))["settings"]["three"]["runs"] == runs


def _load_reproduce():
    spec = importlib.util.spec_from_file_location(
        "reproduce", os.path.join(ROOT, "experiments", "reproduce.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_methods_of_one_seed_share_the_warm_start_halves_they_agree_on(tmp_path):
    """On the real single-task configs: every method of a seed (the baseline included) gets a
    finished sibling's actor half; Comp. RL, static and exp. only also its extractor half; another
    seed gets nothing."""
    rp = _load_reproduce()
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
    rp = _load_reproduce()
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
    rp = _load_reproduce()
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
    rp = _load_reproduce()
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


def test_exported_records_rebuild_the_table_and_add_to_earlier_ones(grid, tmp_path):
    """--export keeps a finished run's metrics, config and report only; the export folder's table
    equals the grid's, and a record already there (an earlier machine's run) counts with them."""
    out, logged, results = grid
    dest = tmp_path / "records"
    earlier = rr.Run("three", "crl", 2, str(dest / "crl" / "seed2"), STEPS, TASKS, episodes_per_step=16)
    write_run(earlier.workdir, np.random.default_rng(7), PREFIXES["crl"])
    runs = [rr.Run(r["run"].split("/")[0], r["run"].split("/")[1], int(r["run"][-1]),
                   str(out / r["workdir"]), STEPS, TASKS, episodes_per_step=16)
            for r in results["settings"]["three"]["runs"]]
    for run in runs:
        run.state, run.last_step = rr.run_state(run)
    records = _load_reproduce().grid_export.export_records(runs, str(out), str(dest))
    assert sorted(os.listdir(dest / "baseline" / "seed0")) == ["metrics.jsonl", "report.md"]
    assert not (dest / "static").exists()  # nothing finished, nothing copied
    states = {r.name: r.state for r in records}
    assert states["three/crl/seed2"] == "done" and states["three/static/seed0"] == "missing"
    exported = rr.write_results(records, SEEDS, str(dest))
    assert (_row(exported, "baseline", "eval/without_exp")["per_task"]
            == _row(results, "baseline", "eval/without_exp")["per_task"])
    crl = _row(exported, "crl", "eval/with_exp")["per_task"][TASKS[0]]
    finals = [logged[f"three/crl/seed{s}"]["final"]["eval/with_exp"] for s in (0, 1)]
    with open(os.path.join(earlier.workdir, "metrics.jsonl")) as f:
        last_eval = [json.loads(line) for line in f if "with_exp/success/" in line][-1]
    values = [f[f"eval/with_exp/success/{TASKS[0]}"] for f in finals]
    values.append(last_eval[f"eval/with_exp/success/{TASKS[0]}"])
    assert crl["n"] == 3
    np.testing.assert_allclose(crl["values"], values)
    assert "three/crl/seed2" not in exported["settings"]["three"]["not_in_table"]


def test_export_folder_must_differ_from_the_output(tmp_path, capsys):
    rp = _load_reproduce()
    with pytest.raises(SystemExit):
        rp.parse_args([f"--out={tmp_path}", f"--export={tmp_path}"])
    assert "--export must name another folder" in capsys.readouterr().err
    args = rp.parse_args([f"--out={tmp_path / 'a'}", f"--export={tmp_path / 'b'}"])
    assert args.export == str(tmp_path / "b") and args.warm_starts is None


def test_warm_starts_are_kept_outside_the_source_tree_and_only_with_export(tmp_path, capsys):
    """Warm starts are binary checkpoints: the records in git must not hold them."""
    rp = _load_reproduce()
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
    rp = _load_reproduce()
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
    three_row = _row(results, "crl", "eval/with_exp", setting="three")
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
    rp = _load_reproduce()
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
    rp = _load_reproduce()
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
    paired = _row(results, "crl", "eval/without_exp")["vs_baseline"]
    assert paired["other_actor_seeds"] == ["1"] and paired["n"] == 2

    def average(method, seed):
        final = logged[(method, seed)]["final"]["eval/without_exp"]
        return np.mean([final[f"eval/without_exp/success/{t}"] for t in TASKS])

    np.testing.assert_allclose(paired["values"],
                               [average("crl", s) - average("baseline", s) for s in (0, 2)])
    markdown = (tmp_path / "results.md").read_text()
    assert "Left out of the pairing" in markdown and "Comp. RL (eval w/o exp.) seed 1" in markdown
