"""A uniform random agent over an environment's currently valid actions.

The floor every scripted expert is compared against: each turn it picks one of `env.valid_actions()`
uniformly, from its own seeded generator, so a run is reproducible. Environments whose actions
include free text (a search box) supply that text through `free_text_action`.

Also owns `play_episode`, the plain single-env loop the agents are measured and tested with.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from crl_jax.envs.base import ScriptedAgent, TextEnv


class RandomAgent(ScriptedAgent):
    """Picks uniformly among valid actions; `seed` plus the episode seed fix its choices."""

    def __init__(self, seed: int = 0,
                 free_text_action: Callable[[TextEnv, dict[str, Any]], str | None] | None = None):
        self.seed = seed
        self.free_text_action = free_text_action
        self.env: TextEnv | None = None
        self.rng = random.Random(seed)

    def reset(self, env: TextEnv, observation: str, info: dict[str, Any]) -> None:
        self.env = env
        self.rng = random.Random(f"random-agent/{self.seed}/{info.get('seed', 0)}")

    def act(self, observation: str, info: dict[str, Any]) -> str:
        choices = list(self.env.valid_actions())
        if self.free_text_action is not None:
            extra = self.free_text_action(self.env, info)
            if extra is not None:
                choices.append(extra)
        if not choices:
            return "<answer>look</answer>"
        return f"<answer>{self.env.answer_for(self.rng.choice(choices))}</answer>"


def play_episode(env: TextEnv, agent: ScriptedAgent, seed: int) -> dict[str, Any]:
    """Play one episode of `agent` in `env`; returns success, turns and the observation sequence."""
    observation, info = env.reset(seed)
    agent.reset(env, observation, info)
    observations = [observation]
    done = False
    while not done:
        observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
        observations.append(observation)
        done = terminated or truncated
    return {"success": bool(info["success"]), "turns": info["turn"],
            "invalid_actions": info["invalid_actions"], "observations": observations}
