"""Stop a training run at a step boundary on SIGTERM or SIGINT, so that no finished step is lost.

A preempted VM, a scheduler's time limit or a Ctrl-C sends SIGTERM or SIGINT. Without a handler the
run dies mid-step and resumes from its last periodic checkpoint, losing every step since (on the
embedded mixtures, checkpoints every 10 steps of ~4 minutes each). With `StopRequests` active, the
first such signal only sets a flag; the training loop reads it after each step, checkpoints that
step and ends the run with `Stopped`. Before RL the trainer reads it after each warm-start half and
after the start evaluation, which are kept in the workdir. A second signal of the same kind acts as
it did before (SIGINT raises KeyboardInterrupt, SIGTERM ends the process), for when the current step
cannot be waited for. Handlers can only be installed from the main thread; elsewhere nothing is
installed and the flag stays unset.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The run stopped early on a signal, after checkpointing `next_step` (resume to go on); with
    `next_step` 0, before the first RL step, its finished stages kept in the workdir."""

    def __init__(self, signum: int, next_step: int):
        self.signum, self.next_step = signum, next_step
        name = signal.Signals(signum).name
        if next_step == 0:
            super().__init__(f"stopped by {name} before the first RL step; what it finished (warm-"
                             f"start halves, the start evaluation) is kept in the workdir: run the "
                             f"same command again to go on from there")
        else:
            super().__init__(f"stopped by {name} with steps 0-{next_step - 1} done and "
                             f"checkpointed; run the same command again to resume from step "
                             f"{next_step}")


class StopRequests:
    """Context manager: while active, `signum` is the first SIGTERM / SIGINT received (else None)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        # The next signal of this kind acts as it would have without us.
        signal.signal(signum, self._previous.pop(signum, signal.SIG_DFL))

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                previous = signal.signal(signum, self._handle)
                # None: a handler installed outside Python, which cannot be reinstalled from here.
                self._previous[signum] = signal.SIG_DFL if previous is None else previous
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def agreed_signal(stop: StopRequests | None, hosts=None) -> int:
    """The signal that asks the run to stop (0: none). Hosts of a multi-host run agree on it, so
    all of them checkpoint the same step and stop together."""
    if stop is None:
        return 0
    signum = stop.signum or 0
    return max(hosts.allgather(signum)) if hosts else signum


def raise_if_stopping(stop: StopRequests | None, hosts=None) -> None:
    """Raise Stopped(signum, 0) where a stop was asked for before the first RL step."""
    signum = agreed_signal(stop, hosts)
    if signum:
        raise Stopped(signum, 0)
