"""Scripted expert and random agent for the TextWorld environments.

The expert follows the game's own policy commands (TextWorld's solver, recomputed from the current
state each turn), which is privileged information the agent never sees. The random agent picks
uniformly among the admissible commands.
"""

from __future__ import annotations

from typing import Any

from crl_jax.envs.base import ScriptedAgent
from crl_jax.envs.random_agent import RandomAgent
from crl_jax.envs.textworld_env import TextWorldEnv


class TextWorldExpert(ScriptedAgent):
    """Plays the first of TextWorld's policy commands each turn."""

    def reset(self, env: TextWorldEnv, observation: str, info: dict[str, Any]) -> None:
        if not isinstance(env, TextWorldEnv):
            raise TypeError(f"TextWorldExpert needs a TextWorldEnv, got {type(env).__name__}")
        self.env = env

    def act(self, observation: str, info: dict[str, Any]) -> str:
        plan = self.env.policy_commands()
        return f"<answer>{plan[0] if plan else 'look'}</answer>"


def textworld_random_agent(seed: int = 0) -> RandomAgent:
    return RandomAgent(seed=seed)
