"""One run per workdir (crl_jax.run.workdir_lock): a second process is refused, with the holder named,
before it can touch the workdir; a killed holder leaves no stale lock."""

import os
import signal
import subprocess
import sys

import pytest

from crl_jax.run import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = ("import sys, time; from crl_jax.run import workdir_lock; workdir_lock.acquire(sys.argv[1]); "
        "print('locked', flush=True); time.sleep(120)")


@pytest.fixture
def holder(tmp_path):
    """Another process holding tmp_path's lock."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    yield process
    process.kill()
    process.wait()


def test_a_second_process_is_refused_until_the_holder_dies(tmp_path, holder):
    with pytest.raises(workdir_lock.WorkdirInUse, match=f"pid {holder.pid} "):
        workdir_lock.acquire(str(tmp_path))
    holder.send_signal(signal.SIGKILL)  # a crash: nothing releases the lock but the kernel
    holder.wait()
    workdir_lock.acquire(str(tmp_path))
    try:
        workdir_lock.acquire(str(tmp_path) + "/")  # re-entrant within a process, by real path
        with open(tmp_path / workdir_lock.LOCK_FILE) as f:
            assert f.read().startswith(f"pid {os.getpid()} ")
    finally:
        workdir_lock.release(str(tmp_path))
    workdir_lock.release(str(tmp_path))  # releasing what is not held is a no-op


def test_release_lets_another_process_in(tmp_path):
    workdir_lock.acquire(str(tmp_path))
    workdir_lock.release(str(tmp_path))
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
    finally:
        process.kill()
        process.wait()


def test_run_cli_refuses_a_workdir_in_use_and_leaves_it_alone(tmp_path, tmp_path_factory, holder):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"),
                             "--config=single_task.py", f"--workdir={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu",
                                 "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache"))})
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "in use by another training run" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert sorted(os.listdir(tmp_path)) == [".lock", "metrics.jsonl"]
