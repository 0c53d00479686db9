"""graceful_stop.StopRequests: the first SIGTERM / SIGINT is only recorded, a second one acts as it
did before, and leaving the context restores the previous handlers."""

import os
import signal
import threading

import pytest

from crl_jax.run import graceful_stop


def test_first_signal_is_recorded_and_a_second_sigint_interrupts():
    # Python's own SIGINT handler, as in a run's main process (a test worker may ignore SIGINT).
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _first_recorded_second_interrupts()
    finally:
        signal.signal(signal.SIGINT, outer)


def _first_recorded_second_interrupts():
    before = {s: signal.getsignal(s) for s in graceful_stop.SIGNALS}
    with graceful_stop.StopRequests() as stop:
        assert stop.signum is None
        os.kill(os.getpid(), signal.SIGINT)  # delivered before the next line runs
        assert stop.signum == signal.SIGINT
        os.kill(os.getpid(), signal.SIGTERM)  # another kind, first of its own: recorded too
        assert stop.signum == signal.SIGINT   # the first one is what is reported
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # give the interpreter a chance to run the handler
    assert {s: signal.getsignal(s) for s in graceful_stop.SIGNALS} == before


def test_nothing_is_installed_outside_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def body():
        with graceful_stop.StopRequests() as stop:
            seen["signum"] = stop.signum
            seen["handler"] = signal.getsignal(signal.SIGTERM)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"signum": None, "handler": before}


def test_stopped_says_how_to_resume():
    text = str(graceful_stop.Stopped(signal.SIGTERM, 7))
    assert "SIGTERM" in text and "steps 0-6 done" in text and "resume from step 7" in text
    before_rl = str(graceful_stop.Stopped(signal.SIGINT, 0))  # no "steps 0--1"
    assert "SIGINT before the first RL step" in before_rl and "run the same command again" in before_rl
