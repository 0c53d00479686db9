"""experiments/reproduce_results.py on synthetic metrics logs: Table 1 cells against numpy, missing
runs reported as missing (never as zeros), rollout-time ratio, curves written."""

import json
import os

import numpy as np
import pytest

from crl_jax.config import WarmStartConfig
from tests.reproduce_logs import (PREFIXES, SEEDS, STEPS, TASKS, load_reproduce, rr, table_row,
                                  write_run)


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


@pytest.mark.parametrize("method,prefix,seeds", [("baseline", "eval/without_exp", (0, 1, 2)),
                                                 ("crl", "eval/with_exp", (0, 1)),
                                                 ("crl", "eval/without_exp", (0, 1))])
def test_table_cells_match_numpy(grid, method, prefix, seeds):
    _, logged, results = grid
    row = table_row(results, method, prefix)
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
    static = table_row(results, "static", "eval/with_exp")
    assert static["per_task"][TASKS[0]]["n"] == 0 and "mean" not in static["per_task"][TASKS[0]]
    md = open(out / "results.md").read()
    assert "| Static Online Exp. (eval w/ exp.) | missing | missing | missing |" in md
    crl = table_row(results, "crl", "eval/with_exp")
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
    assert table_row(results, "crl", "eval/with_exp", "single")["avg"]["n"] == 0
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
    records = load_reproduce().grid_export.export_records(runs, str(out), str(dest))
    assert sorted(os.listdir(dest / "baseline" / "seed0")) == ["metrics.jsonl", "report.md"]
    assert not (dest / "static").exists()  # nothing finished, nothing copied
    states = {r.name: r.state for r in records}
    assert states["three/crl/seed2"] == "done" and states["three/static/seed0"] == "missing"
    exported = rr.write_results(records, SEEDS, str(dest))
    assert (table_row(exported, "baseline", "eval/without_exp")["per_task"]
            == table_row(results, "baseline", "eval/without_exp")["per_task"])
    crl = table_row(exported, "crl", "eval/with_exp")["per_task"][TASKS[0]]
    finals = [logged[f"three/crl/seed{s}"]["final"]["eval/with_exp"] for s in (0, 1)]
    with open(os.path.join(earlier.workdir, "metrics.jsonl")) as f:
        last_eval = [json.loads(line) for line in f if "with_exp/success/" in line][-1]
    values = [f[f"eval/with_exp/success/{TASKS[0]}"] for f in finals]
    values.append(last_eval[f"eval/with_exp/success/{TASKS[0]}"])
    assert crl["n"] == 3
    np.testing.assert_allclose(crl["values"], values)
    assert "three/crl/seed2" not in exported["settings"]["three"]["not_in_table"]

