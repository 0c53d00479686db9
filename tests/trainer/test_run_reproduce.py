"""experiments/reproduce.py end to end on the tiny run: two methods x one seed of one step each,
their results in the table, and a second invocation that skips the finished runs. (Named to run
after test_run_cli in the same session, whose compilations of the tiny run it reuses.)"""

import json
import os
import signal
import subprocess
import sys
import time

from tests.trainer.conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPRODUCE = os.path.join(ROOT, "experiments", "reproduce.py")
TINY = os.path.join(ROOT, "tests", "trainer", "tiny_variants_config.py")


def reproduce(out, cache, *extra):
    args = [sys.executable, REPRODUCE, f"--out={out}", f"--setting=tiny={TINY}",
            "--methods=baseline,crl", "--seeds=0", "--steps=1", *extra]
    # Its own process group, so a timeout also ends the training run it started.
    process = subprocess.Popen(args, cwd=ROOT, env=subprocess_env(cache), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def test_grid_runs_then_resumes_by_skipping_finished_runs(tmp_path, compile_cache):
    out = tmp_path / "repro"
    first = reproduce(out, compile_cache)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[1/2] tiny/baseline/seed0: starting" in first.stdout
    assert "[2/2] tiny/crl/seed0: starting" in first.stdout
    assert "tiny/crl/seed0: step 1/1" in first.stdout  # the child's progress line, streamed
    for method in ("baseline", "crl"):
        workdir = out / "tiny" / method / "seed0"
        config = json.loads((workdir / "config.json").read_text())
        assert config["seed"] == 0 and config["steps"] == 1
        assert config["memory"]["enabled"] == (method == "crl")  # the variant reached the trainer
    results = json.loads((out / "results.json").read_text())["settings"]["tiny"]
    assert results["not_in_table"] == []
    cells = {(r["method"], r["eval"]): r["avg"]["n"] for r in results["table"]}
    assert cells == {("baseline", "eval/without_exp"): 1, ("crl", "eval/with_exp"): 1,
                     ("crl", "eval/without_exp"): 1}
    assert set(results["actor_rollout_s"]) == {"baseline", "crl"}
    assert (out / "curves_tiny.png").exists() and (out / "results.md").exists()

    logs = {m: (out / "tiny" / m / "seed0" / "metrics.jsonl").read_text() for m in ("baseline", "crl")}
    second = reproduce(out, compile_cache)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "starting" not in second.stdout
    assert second.stdout.count("done, skipped") == 2
    for method, text in logs.items():
        assert (out / "tiny" / method / "seed0" / "metrics.jsonl").read_text() == text

    listed = reproduce(out, compile_cache, "--dry-run", "--seeds=0,1")
    assert listed.returncode == 0, listed.stderr
    assert "2 of 4 runs done, 2 to run" in listed.stdout
    assert not (out / "tiny" / "crl" / "seed1").exists()  # a dry run starts nothing

    # Another config for the same workdirs (the configs changed): not done, and not run either.
    changed = reproduce(out, compile_cache, f"--setting=tiny={TINY}:no_merge", "--methods=crl")
    assert changed.returncode == 1
    assert "tiny/crl/seed0: its workdir holds a run of another config" in changed.stdout
    assert "memory.merge_every" in changed.stdout and "starting" not in changed.stdout
    assert (out / "tiny" / "crl" / "seed0" / "metrics.jsonl").read_text() == logs["crl"]


def test_sigterm_to_the_grid_lets_its_run_checkpoint_the_current_step(tmp_path, compile_cache):
    """Stopping a grid (SIGTERM to reproduce.py alone, as a scheduler would) ends the training run
    it started after that run's current step, checkpointed, so the next invocation loses nothing."""
    out = tmp_path / "repro"
    args = [sys.executable, REPRODUCE, f"--out={out}", f"--setting=tiny={TINY}", "--methods=baseline",
            "--seeds=0", "--steps=4"]
    process = subprocess.Popen(args, cwd=ROOT, env=subprocess_env(compile_cache), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    workdir = out / "tiny" / "baseline" / "seed0"
    metrics = workdir / "metrics.jsonl"
    try:
        deadline = time.time() + 1800
        while time.time() < deadline and process.poll() is None:
            if metrics.exists() and metrics.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert process.poll() is None, "the grid ended before the signal"
        process.send_signal(signal.SIGTERM)
        stdout, _ = process.communicate(timeout=1800)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, stdout[-3000:]
    assert "tiny/baseline/seed0: stopping after its current step" in stdout
    assert "grid interrupted; the same command continues it" in stdout
    done = metrics.read_text().count("\n")
    assert 1 <= done < 4
    assert max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()) == done
    assert not (workdir / "report.md").exists()
