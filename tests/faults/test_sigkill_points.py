"""SIGKILL at the points where a run holds unfinished work (mid warm start, mid start evaluation,
mid checkpoint save, mid final evaluation), one after the other on one workdir, each followed by
a restart: the run that finally completes logs exactly what an uninterrupted run logs, the
warm start and every evaluation included. (SIGKILL between RL steps: tests/trainer/test_run_cli.py.)"""

import json
import os
import signal
import subprocess
import sys

from crl_jax.run.metrics import is_machine_figure
from tests.trainer.conftest import compile_cache, subprocess_env  # noqa: F401 (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
KILLED = os.path.join(ROOT, "tests", "faults", "killed_run.py")
CONFIG = os.path.join(ROOT, "tests", "faults", "warm_run_config.py")

# Each kill lands in the run that the previous kill's restart is: the second one in the start
# evaluation the first restart plays, the third in step 1's save, the fourth in the final
# evaluation (the start evaluation is kept by then, so it is this process's first).
KILLS = ["warm_start_actor:3", "eval_with_exp:1", "checkpoint_save:2", "eval_with_exp:1"]


def run(workdir, cache, kill=None):
    command = [KILLED, kill] if kill else [RUN]
    return subprocess.run([sys.executable, *command, f"--config={CONFIG}", f"--workdir={workdir}"],
                          cwd=ROOT, env=subprocess_env(cache), capture_output=True, text=True,
                          timeout=600)


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if not is_machine_figure(k)} for line in f]


def test_sigkill_anywhere_then_restart_logs_the_uninterrupted_run(tmp_path, compile_cache):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert run(reference, compile_cache).returncode == 0
    seen = []
    for kill in KILLS:
        result = run(killed, compile_cache, kill)
        assert result.returncode == -signal.SIGKILL, (kill, result.stderr[-3000:])
        seen.append((len(rows(killed / "warm_start" / "actor" / "metrics.jsonl")),
                     len(rows(killed / "metrics.jsonl")),
                     sorted(d for d in os.listdir(killed / "checkpoints") if d.isdigit())
                     if (killed / "checkpoints").exists() else []))
    # Where each kill landed (warm-start rows, run rows, committed checkpoints): after 2 of the
    # actor's 6 warm-start steps; in the start evaluation, the warm start done; in the save of
    # step 1 (checkpoint 2), both rows logged, the final evaluation in the last; in the final
    # evaluation of the rerun that restored checkpoint 1.
    assert seen == [(2, 0, []), (6, 0, []), (6, 2, ["1"]), (6, 1, ["1"])], seen
    result = run(killed, compile_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert rows(killed / "metrics.jsonl") == rows(reference / "metrics.jsonl")
    for half in ("actor", "extractor"):
        curve = os.path.join("warm_start", half, "metrics.jsonl")
        assert rows(killed / curve) == rows(reference / curve)
    assert (killed / "report.md").exists()
