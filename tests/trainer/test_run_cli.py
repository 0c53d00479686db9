"""experiments/run.py end to end: bad configs, exact resume after SIGKILL, corrupt checkpoints."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from crl_jax.run.metrics import is_machine_figure
from tests.trainer.conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
TINY = os.path.join(ROOT, "tests", "trainer", "tiny_config.py")

MALFORMED = [
    ["--config.steps=0"],
    ["--config.rollout.group_size=-1"],
    ["--config.rollout.group_size=abc"],
    ["--config.tasks=('nope/env',)"],
    ["--config.rl.advantage_split=median"],
    ["--config.rollout.free_per_group=9"],
    ["--config.actor.dtype=float64"],
    ["--config.rollout.max_new_tokens=5000"],
    ["--config.rollout.bogus=1"],
    ["--config=single_task.py:no_such_variant"],
    ["--config=no_such_file.py"],
    ["--config.memory.demote_probability=2.0"],
]


@pytest.mark.parametrize("args", MALFORMED, ids=lambda a: a[0])
def test_malformed_config_gives_one_line_and_nonzero_exit(args, tmp_path):
    result = subprocess.run([sys.executable, RUN, *args, f"--workdir={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not os.listdir(tmp_path)  # failed before any compute or file


def run_cli(workdir, cache, steps: int, *extra):
    return subprocess.Popen([sys.executable, RUN, f"--config={TINY}:{steps}", f"--workdir={workdir}", *extra],
                            cwd=ROOT, env=subprocess_env(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def metric_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not is_machine_figure(k)} for r in rows]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, compile_cache):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    process = run_cli(workdir, compile_cache, steps=4)
    out, _ = process.communicate(timeout=1800)
    assert process.returncode == 0, out[-3000:]
    return workdir


def test_resume_after_sigkill_repeats_the_uninterrupted_run(reference_run, tmp_path, compile_cache):
    expected = metric_rows(reference_run)
    assert [r["step"] for r in expected] == [0, 1, 2, 3]
    kill_after = random.Random().randint(1, 3)  # rows logged before the kill
    process = run_cli(tmp_path, compile_cache, steps=4)
    metrics = os.path.join(tmp_path, "metrics.jsonl")
    deadline = time.time() + 1800
    checkpoints = os.path.join(tmp_path, "checkpoints")

    def committed_steps():
        return [d for d in os.listdir(checkpoints) if d.isdigit()] if os.path.isdir(checkpoints) else []

    # Kill once `kill_after` rows are logged and at least one checkpoint is committed, so the
    # restart has something to restore (and, depending on timing, steps to redo).
    while time.time() < deadline and process.poll() is None:
        if (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= kill_after
                and committed_steps()):
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    restarted = run_cli(tmp_path, compile_cache, steps=4)
    out, _ = restarted.communicate(timeout=1800)
    assert restarted.returncode == 0, out[-3000:]
    assert "restored checkpoint" in out
    assert metric_rows(tmp_path) == expected


def test_sigterm_checkpoints_the_current_step_and_the_resumed_run_repeats_the_uninterrupted_one(
        reference_run, tmp_path, compile_cache):
    """A SIGTERM (preemption) mid-run: the run finishes the step it is in, checkpoints it although
    no periodic checkpoint is due, writes no report and exits with 128 + 15; rerun, it resumes
    from that step and logs what the uninterrupted run logged."""
    no_periodic = "--config.checkpoint.every=100"
    process = run_cli(tmp_path, compile_cache, 4, no_periodic)
    metrics = os.path.join(tmp_path, "metrics.jsonl")
    deadline = time.time() + 1800
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 1:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before the signal"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=1800)
    assert process.returncode == 128 + signal.SIGTERM, out[-3000:]
    done = len(metric_rows(tmp_path))
    assert 1 <= done < 4
    assert f"stopped by SIGTERM with steps 0-{done - 1} done and checkpointed" in out
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [str(done)]
    assert not (tmp_path / "report.md").exists()  # not finished: reproduce.py resumes it

    resumed = run_cli(tmp_path, compile_cache, 4, no_periodic)
    out, _ = resumed.communicate(timeout=1800)
    assert resumed.returncode == 0, out[-3000:]
    assert f"restored checkpoint of step {done}" in out
    assert metric_rows(tmp_path) == metric_rows(reference_run)
    assert (tmp_path / "report.md").exists()


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(reference_run, tmp_path,
                                                                   compile_cache):
    workdir = tmp_path / "run"
    shutil.copytree(reference_run, workdir)
    latest = workdir / "checkpoints" / "4"
    victim = max((p for p in latest.rglob("*") if p.is_file() and p.stat().st_size > 64),
                 key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    process = run_cli(workdir, compile_cache, steps=4)
    out, _ = process.communicate(timeout=1800)
    assert process.returncode == 0, out[-3000:]
    assert "checkpoint step 4" in out and "unusable" in out
    assert "restored checkpoint of step 3" in out
    assert metric_rows(workdir) == metric_rows(reference_run)
