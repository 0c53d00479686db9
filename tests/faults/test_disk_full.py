"""A checkpoint save that runs out of room stops the run with one line saying why; the previous
checkpoint is kept, and a rerun with room resumes from it and logs what a run that never lacked
room logs.

The full disk is a file-size limit (RLIMIT_FSIZE) set for the resumed run only: Orbax's data
files of the next checkpoint outgrow it, while the logs stay far below it."""

import json
import os
import resource
import subprocess
import sys

from crl_jax.run.metrics import is_machine_figure
from tests.trainer.conftest import compile_cache, subprocess_env  # noqa: F401 (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
TINY = os.path.join(ROOT, "tests", "trainer", "tiny_config.py")
LIMIT_BYTES = 150_000  # the tiny run's checkpoint data files are 270-860 KB, its logs under 10 KB


def run(workdir, cache, steps, limit=None):
    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, RUN, f"--config={TINY}:{steps}", f"--workdir={workdir}"],
                          cwd=ROOT, env=subprocess_env(cache), capture_output=True, text=True,
                          timeout=900, preexec_fn=limit_file_size if limit else None)


def metric_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not is_machine_figure(k)} for r in rows]


def test_a_full_disk_during_a_save_keeps_the_previous_step(tmp_path, compile_cache):
    full, reference = tmp_path / "full", tmp_path / "reference"
    assert run(full, compile_cache, 2).returncode == 0
    kept = sorted(os.listdir(full / "checkpoints"))

    result = run(full, compile_cache, 4, limit=LIMIT_BYTES)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "saving the checkpoint of step 3" in errors[0] and "is the disk full?" in errors[0]
    assert "step 2 is the newest complete checkpoint" in errors[0]
    assert [s for s in sorted(os.listdir(full / "checkpoints")) if s.isdigit()] == kept

    # The same two commands with room to spare log the same rows as the rerun after the failure.
    assert run(full, compile_cache, 4).returncode == 0
    for steps in (2, 4):
        assert run(reference, compile_cache, steps).returncode == 0
    assert metric_rows(full) == metric_rows(reference)
