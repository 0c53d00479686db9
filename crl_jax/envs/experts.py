"""Lookup of each environment's scripted expert and random agent.

Owns `expert_for(env)` and `random_agent_for(env, seed)`. Experts live next to their envs
(minihack_expert, sokoban, household_agents, shop_agents, textworld_agents); the table below maps
an env class name to "module:factory" strings so optional packages load only when needed. An env
may also provide `make_expert()` / `make_random_agent(seed)` methods, which take precedence.
"""

from __future__ import annotations

import importlib

from crl_jax.envs.base import ScriptedAgent, TextEnv
from crl_jax.envs.random_agent import RandomAgent

# env class name -> (expert "module:factory", random agent "module:factory" or None for plain)
_AGENTS = {
    "MiniHackEnv": ("crl_jax.envs.minihack_expert:MiniHackExpert", None),
    "SokobanEnv": ("crl_jax.envs.sokoban:SokobanExpert", None),
    "HouseholdEnv": ("crl_jax.envs.household_agents:HouseholdExpert",
                     "crl_jax.envs.household_agents:household_random_agent"),
    "ShopEnv": ("crl_jax.envs.shop_agents:ShopExpert", "crl_jax.envs.shop_agents:shop_random_agent"),
    "TextWorldEnv": ("crl_jax.envs.textworld_agents:TextWorldExpert",
                     "crl_jax.envs.textworld_agents:textworld_random_agent"),
}


def _load(path: str):
    module_name, attr = path.split(":")
    return getattr(importlib.import_module(module_name), attr)


def _entry(env: TextEnv):
    env = getattr(env, "unwrapped", env)
    for cls in type(env).__mro__:
        if cls.__name__ in _AGENTS:
            return _AGENTS[cls.__name__]
    return None


def expert_for(env: TextEnv) -> ScriptedAgent:
    """The scripted expert for `env`; raises LookupError when there is none."""
    make_expert = getattr(env, "make_expert", None)
    if callable(make_expert):
        return make_expert()
    entry = _entry(env)
    if entry is None:
        raise LookupError(f"no scripted expert known for {type(env).__name__} ({env.name})")
    return _load(entry[0])()


def random_agent_for(env: TextEnv, seed: int = 0) -> ScriptedAgent:
    """The random agent for `env` (uniform over valid actions, plus free text where an env needs it)."""
    make_random = getattr(env, "make_random_agent", None)
    if callable(make_random):
        return make_random(seed)
    entry = _entry(env)
    if entry is not None and entry[1] is not None:
        return _load(entry[1])(seed)
    return RandomAgent(seed=seed)
