"""Scripted agents for every environment: the random agent and the lookup of each env's expert.

Owns: `RandomAgent` (uniform over `env.valid_actions()`, seeded per episode) and `expert_for(env)`,
which finds an environment's scripted expert. An environment module declares its expert either as
a method `env.make_expert()` or, for the envs built here, in `_EXPERTS` (class name -> module:class),
so optional packages are imported only when needed.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

from crl_jax.envs.base import ScriptedAgent, TextEnv

_EXPERTS = {
    "MiniHackEnv": ("crl_jax.envs.minihack_expert", "MiniHackExpert"),
    "SokobanEnv": ("crl_jax.envs.sokoban", "SokobanExpert"),
}


class RandomAgent(ScriptedAgent):
    """Picks a uniformly random valid action each turn; deterministic given `seed` and the env seed."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._rng = random.Random(seed)

    def reset(self, env: TextEnv, observation: str, info: dict[str, Any]) -> None:
        self.env = env
        self._rng = random.Random(f"{self.seed}:{info.get('seed')}")

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return f"<answer>{self._rng.choice(self.env.valid_actions())}</answer>"


def expert_for(env: TextEnv) -> ScriptedAgent:
    """The scripted expert for `env`; raises LookupError when the env has none."""
    make_expert = getattr(env, "make_expert", None)
    if callable(make_expert):
        return make_expert()
    for cls in type(env).__mro__:
        if cls.__name__ in _EXPERTS:
            module_name, class_name = _EXPERTS[cls.__name__]
            return getattr(importlib.import_module(module_name), class_name)()
    module = importlib.import_module(type(env).__module__)
    for attr in ("make_expert", "Expert"):
        factory = getattr(module, attr, None)
        if callable(factory):
            return factory()
    raise LookupError(f"no scripted expert known for {type(env).__name__} ({env.name})")
