"""Fault-injecting environment wrappers, to check that the runner survives broken environments.

Owns `FaultyEnv`: wraps any `TextEnv` and, deterministically from its own seed, raises on a given
fraction of steps and/or sleeps past a runner's timeout on a given fraction of steps. Everything
else (prompt, parsing, valid actions) is the wrapped env's; `unwrapped` exposes it for experts.
"""

from __future__ import annotations

import random
import time

from crl_jax.envs.base import TextEnv


class InjectedFault(RuntimeError):
    """What FaultyEnv raises, so tests can tell injected faults from real bugs."""


class FaultyEnv:
    def __init__(self, env: TextEnv, raise_prob: float = 0.0, hang_prob: float = 0.0,
                 hang_s: float = 5.0, seed: int = 0):
        for name, p in (("raise_prob", raise_prob), ("hang_prob", hang_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"FaultyEnv: {name} must be in [0, 1], got {p}")
        self.env = env
        self.raise_prob, self.hang_prob, self.hang_s = raise_prob, hang_prob, hang_s
        self._rng = random.Random(seed)
        self.faults: list[str] = []  # what was injected, in order

    @property
    def unwrapped(self) -> TextEnv:
        return getattr(self.env, "unwrapped", self.env)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, seed: int):
        return self.env.reset(seed)

    def step(self, action_text: str):
        u = self._rng.random()
        if u < self.raise_prob:
            self.faults.append("raise")
            raise InjectedFault(f"injected fault in {self.env.name} at turn {self.env._turn + 1}")
        if u < self.raise_prob + self.hang_prob:
            self.faults.append("hang")
            time.sleep(self.hang_s)
        return self.env.step(action_text)
