"""Text environments behind one protocol (`base.TextEnv`) and a registry (`make`, `list_envs`)."""

from crl_jax.envs.base import ScriptedAgent, StepResult, TextEnv, parse_answer_tag
from crl_jax.envs.registry import list_envs, make, register

__all__ = ["ScriptedAgent", "StepResult", "TextEnv", "list_envs", "make", "parse_answer_tag", "register"]
