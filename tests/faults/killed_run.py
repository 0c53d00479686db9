"""`python tests/faults/killed_run.py POINT:N [experiments/run.py flags]`: the run, SIGKILLed by
itself the N-th time it reaches POINT, with no chance to clean up (as a lost machine would be).

POINT is one of:
  warm_start_actor  a row of the warm start's behaviour-cloning curve is written (mid-half);
  eval_with_exp     an evaluation's with-experience episodes are played (mid-evaluation);
  checkpoint_save   a checkpoint's files are written, before the step is committed.
"""

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def kill_on_call(owner, name: str, times: int, when=lambda *a, **k: True) -> None:
    """Replace owner.name by a wrapper that SIGKILLs the process on the `times`-th matching call."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args, **kwargs):
        if when(*args, **kwargs):
            calls[0] += 1
            if calls[0] == times:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def main(point: str, times: int, argv: list[str]) -> None:
    from crl_jax.run import checkpoint, metrics

    if point == "warm_start_actor":
        kill_on_call(metrics.MetricsWriter, "write", times,
                     lambda self, *a, **k: os.path.basename(os.path.normpath(self.workdir)) == "actor")
    elif point == "eval_with_exp":
        kill_on_call(metrics.Progress, "update", times,
                     lambda self, *a, **k: self.label.startswith(metrics.EVAL_WITH_EXP))
    elif point == "checkpoint_save":
        kill_on_call(checkpoint, "_write_manifest", times)
    else:
        raise SystemExit(f"unknown kill point {point!r}")
    import run
    run.main(argv)


if __name__ == "__main__":
    spec, *rest = sys.argv[1:]
    name, _, count = spec.partition(":")
    main(name, int(count or 1), rest)
