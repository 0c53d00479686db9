"""Launching one run of the grid: `python experiments/run.py ...` as a subprocess, its output to
`<workdir>/run.log` with its progress lines echoed, a status file when it ends, and a graceful stop
passed on when the grid is interrupted."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

from reproduce_results import STATUS_FILE, Run

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(_HERE)
RUN = os.path.join(_HERE, "run.py")
ECHO = ("step ", "restored checkpoint", "Traceback", "Error", "error:")  # child lines shown live
TAIL_LINES = 30


def command(run: Run, spec: str, steps: int | None, cache_from: list[str] = ()) -> list[str]:
    return ([sys.executable, RUN, f"--config={spec}"]
            + [f"--config.{o}" for o in overrides(run.seed, steps)] + [f"--workdir={run.workdir}"]
            + ([f"--cache_from={','.join(cache_from)}"] if cache_from else []))


def overrides(seed: int, steps: int | None) -> list[str]:
    return [f"seed={seed}"] + ([f"steps={steps}"] if steps is not None else [])


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def launch(run: Run, spec: str, steps: int | None, env: dict, cache_from: list[str] = ()) -> int:
    """Run one training subprocess to its end; its output goes to run.log, progress lines here."""
    os.makedirs(run.workdir, exist_ok=True)
    cmd = command(run, spec, steps, cache_from)
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
