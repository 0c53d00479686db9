"""Environment registry: `make(name, **kwargs)` and `list_envs()`.

Names map to "module:factory" strings so that optional packages (minihack, textworld) are imported
only when their environments are made.
"""

from __future__ import annotations

import importlib

from crl_jax.envs.base import TextEnv

# name -> ("module path", "factory name", default kwargs)
_REGISTRY: dict[str, tuple[str, str, dict]] = {
    "minihack/room-ultimate-5x5": ("crl_jax.envs.minihack", "MiniHackEnv", {"task": "room-ultimate-5x5"}),
    "minihack/room-ultimate-lit-5x5": ("crl_jax.envs.minihack", "MiniHackEnv",
                                       {"task": "room-ultimate-lit-5x5"}),
    "minihack/mazewalk-9x9": ("crl_jax.envs.minihack", "MiniHackEnv", {"task": "mazewalk-9x9"}),
    "minihack/keyroom-dark-s5": ("crl_jax.envs.minihack", "MiniHackEnv", {"task": "keyroom-dark-s5"}),
    "minihack/river-narrow": ("crl_jax.envs.minihack", "MiniHackEnv", {"task": "river-narrow"}),
    "sokoban/6x6-2box": ("crl_jax.envs.sokoban", "SokobanEnv", {}),
    "textworld/cooking": ("crl_jax.envs.textworld_env", "TextWorldEnv", {"challenge": "cooking"}),
    "textworld/treasure-hunter": ("crl_jax.envs.textworld_env", "TextWorldEnv",
                                  {"challenge": "treasure_hunter"}),
    "household/v1": ("crl_jax.envs.household", "HouseholdEnv", {}),
    "shop/v1": ("crl_jax.envs.shop", "ShopEnv", {}),
    # The same two with numbered actions: an answer may be a listed action's number (envs.base).
    "household/v1-numbered": ("crl_jax.envs.household", "HouseholdEnv", {"numbered_actions": True}),
    "shop/v1-numbered": ("crl_jax.envs.shop", "ShopEnv", {"numbered_actions": True}),
    # The diagnostic where experience is necessary: facts that drift every 6 RL steps.
    "diag/doors": ("crl_jax.envs.doors", "DoorsEnv", {}),
    "alfworld/data": ("crl_jax.envs.alfworld_adapter", "ALFWorldEnv", {}),
    "webshop/data": ("crl_jax.envs.webshop_adapter", "WebShopEnv", {}),
}


def register(name: str, module: str, factory: str, **defaults) -> None:
    """Add an environment (e.g. a user's own) under `name`; `module:factory` is imported lazily."""
    if name in _REGISTRY and _REGISTRY[name][:2] != (module, factory):
        raise ValueError(f"environment name {name!r} is already registered to "
                         f"{_REGISTRY[name][0]}:{_REGISTRY[name][1]}")
    _REGISTRY[name] = (module, factory, dict(defaults))


def list_envs() -> list[str]:
    return sorted(_REGISTRY)


def factory(name: str):
    """The class (or factory) registered as `name`, imported but not built."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(list_envs())}")
    module_name, factory_name, _ = _REGISTRY[name]
    return getattr(importlib.import_module(module_name), factory_name)


def make(name: str, **kwargs) -> TextEnv:
    """Build the environment registered as `name`; kwargs override its defaults."""
    build = factory(name)  # raises for an unknown name
    return build(**{**_REGISTRY[name][2], **kwargs})
