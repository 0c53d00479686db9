"""GuardedEnv: the actor loop's env calls survive raising and hanging environments."""

import time

from crl_jax import envs
from crl_jax.envs.faults import FaultyEnv
from crl_jax.envs.runner import GuardedEnv


def test_raising_env_reports_the_error_and_stays_usable():
    guard = GuardedEnv(FaultyEnv(envs.make("sokoban/6x6-2box"), raise_prob=1.0), timeout_s=5.0)
    (observation, info), error = guard.call("reset", 3)
    assert error is None and "goal" in info
    result, error = guard.call("step", "<answer>up</answer>")
    assert result is None and error.startswith("error: InjectedFault")
    assert not guard.broken


def test_hanging_env_times_out_and_is_abandoned():
    guard = GuardedEnv(FaultyEnv(envs.make("sokoban/6x6-2box"), hang_prob=1.0, hang_s=30.0),
                       timeout_s=0.5)
    guard.call("reset", 3)
    started = time.monotonic()
    result, error = guard.call("step", "<answer>up</answer>")
    assert time.monotonic() - started < 5.0
    assert result is None and error == "timeout: step > 0.5s" and guard.broken
    assert guard.call("reset", 4)[1].startswith("error: environment abandoned")
