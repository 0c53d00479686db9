"""Scripted expert for the household environment (privileged: it reads the true world state).

Each turn it replans from the current state, so it also recovers if it is handed a state midway:
fetch an object of the target type (open its receptacle first if needed), apply the family's
appliance (microwave, fridge, sink basin) or walk to the desk lamp, then place the object at a
receptacle of the destination type. The expert never explores: it knows where things are, which
is what makes it an upper bound rather than a baseline.
"""

from __future__ import annotations

from typing import Any

from crl_jax.envs.base import ScriptedAgent
from crl_jax.envs.household import HouseholdEnv
from crl_jax.envs.household_world import OPENABLE, receptacle_type
from crl_jax.envs.random_agent import RandomAgent

_APPLIANCE = {"heat": ("microwave", "hot"), "cool": ("fridge", "cool"), "clean": ("sinkbasin", "clean")}


class HouseholdExpert(ScriptedAgent):
    """Shortest-plan household agent using privileged state."""

    def reset(self, env: HouseholdEnv, observation: str, info: dict[str, Any]) -> None:
        if not isinstance(env, HouseholdEnv):
            raise TypeError(f"HouseholdExpert needs a HouseholdEnv, got {type(env).__name__}")
        self.env = env

    def _go_and_open(self, receptacle: str) -> str | None:
        env = self.env
        if env.location != receptacle:
            return f"go to {receptacle}"
        if receptacle_type(receptacle) in OPENABLE and receptacle not in env.opened:
            return f"open {receptacle}"
        return None

    def next_action(self) -> str:
        env, scene = self.env, self.env.scene
        holding = env.holding
        if holding is not None and receptacle_type(holding) != scene.target_type:
            # Holding the wrong thing (only after a hand-off): put it back down where we are.
            return (f"put {holding} {env.preposition(env.location)} {env.location}"
                    if env.location and env.visible(env.location) else
                    self._go_and_open(scene.receptacles[0]) or "look")
        if holding is None:
            targets = sorted(o for r in scene.receptacles for o in env.contents[r]
                             if receptacle_type(o) == scene.target_type)
            # Prefer an object that already satisfies the task's state, then the nearest by order.
            needed = _APPLIANCE.get(scene.family, (None, None))[1]
            targets.sort(key=lambda o: needed is None or needed not in env.states.get(o, ()))
            obj = targets[0]
            receptacle = env.where_is(obj)
            return self._go_and_open(receptacle) or f"take {obj} from {receptacle}"
        if scene.family == "examine":
            lamp_at = env.where_is("desklamp 1")
            if env.location != lamp_at:
                return f"go to {lamp_at}"
            return "use desklamp 1"
        if scene.family in _APPLIANCE:
            appliance_type, state = _APPLIANCE[scene.family]
            if state not in env.states.get(holding, ()):
                appliance = next(r for r in scene.receptacles if receptacle_type(r) == appliance_type)
                if env.location != appliance:
                    return f"go to {appliance}"
                verb = {"hot": "heat", "cool": "cool", "clean": "clean"}[state]
                return f"{verb} {holding} with {appliance}"
        destination = next(r for r in scene.receptacles if receptacle_type(r) == scene.destination_type)
        return self._go_and_open(destination) or f"put {holding} {env.preposition(destination)} {destination}"

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return f"<answer>{self.env.answer_for(self.next_action())}</answer>"


def household_random_agent(seed: int = 0) -> RandomAgent:
    """Uniform choice among the admissible commands."""
    return RandomAgent(seed=seed)
