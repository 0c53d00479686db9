"""The in-repo household environment ("household/v1"): an offline, pure-Python ALFWorld analogue.

Owns the episode mechanics: where the agent stands, what it holds, which receptacles are open, the
hot/cool/clean/lit state of objects, the ALFWorld-style command grammar, the admissible commands of
each state, and the success test of the five task families (pick-and-place, heat, cool, clean,
examine under a desk lamp). The world itself comes from `household_world.generate_scene`.

Commands (ALFWorld wording): go to X, open X, close X, take O from X, put O in/on X, heat O with
microwave N, cool O with fridge N, clean O with sinkbasin N, use desklamp N, examine X, look,
inventory. A well-formed command about things in the scene that is not possible right now gets
"Nothing happens." (as in ALFWorld); text naming unknown things or no command is an invalid action.
"""

from __future__ import annotations

import re
from typing import Any

from crl_jax.envs.base import TextEnv
from crl_jax.envs.household_world import (CONTAINERS, FAMILIES, FIXED, OPENABLE, PRIORS, ROOMS,
                                          Scene, generate_scene, receptacle_type)

_APPLIANCE_VERB = {"microwave": "heat", "fridge": "cool", "sinkbasin": "clean"}
_STATE_OF_VERB = {"heat": "hot", "cool": "cool", "clean": "clean"}
_PUT = re.compile(r"^(?:put|move|place) (.+?) (?:in/on|into|onto|in|on|to) (.+)$")
_TAKE = re.compile(r"^(?:take|pick up|get) (.+?) from (.+)$")
_APPLY = re.compile(r"^(heat|cool|clean) (.+?) (?:with|using|in) (.+)$")

SYSTEM_PROMPT = """You are an agent in a household. You are in one room full of receptacles (cabinets, \
drawers, countertops, fridge, ...) that hold objects. Complete the task given after "Your task is to:".
Commands:
  go to <receptacle>            walk to a receptacle (e.g. go to cabinet 1)
  open <receptacle> / close <receptacle>
  take <object> from <receptacle>   you can hold one object at a time
  put <object> in/on <receptacle>
  heat <object> with microwave 1 / cool <object> with fridge 1 / clean <object> with sinkbasin 1
  use desklamp 1                turn the desk lamp on or off (you must be at its receptacle)
  examine <object or receptacle>, look, inventory
You must be at a receptacle to open it, take from it or put into it; closed receptacles hide their \
contents. Objects and receptacles are numbered (mug 1, cabinet 2). "Some mug" in a task means any mug.
Think briefly, then reply with exactly one command inside <answer>...</answer>, e.g. \
<answer>go to countertop 1</answer>."""


def _listing(items: list[str]) -> str:
    if not items:
        return "nothing"
    named = [f"a {item}" for item in items]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + ", and " + named[-1]


class HouseholdEnv(TextEnv):
    """ALFWorld-like rooms, receptacles and objects; deterministic per seed; reward 1 on success."""

    name = "household/v1"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, families: tuple[str, ...] | list[str] | None = None, max_turns: int = 40,
                 list_actions: bool = True, numbered_actions: bool = False):
        super().__init__(numbered_actions=numbered_actions)
        # "household/v1-numbered" numbers the listed commands (see envs.base).
        self.name = "household/v1-numbered" if numbered_actions else "household/v1"
        families = tuple(families) if families else tuple(FAMILIES)
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"household: unknown task families {unknown}; known: {list(FAMILIES)}")
        if max_turns < 1:
            raise ValueError(f"household: max_turns must be >= 1, got {max_turns}")
        self.families = families
        self.max_turns = max_turns
        # ALFWorld agents are usually shown the admissible commands each turn; this keeps that option.
        self.list_actions = list_actions
        self.scene: Scene | None = None

    def vocabulary_texts(self) -> list[str]:
        receptacles = {r for room in ROOMS.values() for r in room}
        objects = {o for room in PRIORS.values() for o in room}
        return [" ".join(sorted(ROOMS) + sorted(receptacles) + sorted(objects) + sorted(FAMILIES))]

    # ---- episode state ---------------------------------------------------------------------------
    def _reset(self, seed: int):
        self.scene = generate_scene(seed, self.families)
        self.contents = {r: list(objs) for r, objs in self.scene.contents.items()}
        self.location: str | None = None
        self.holding: str | None = None
        self.opened: set[str] = set()
        self.states: dict[str, set[str]] = {}
        self.lamp_on = False
        self._objects = {o for objs in self.contents.values() for o in objs}
        self._receptacles = set(self.scene.receptacles)
        observation = (f"You are in the middle of a room. Looking quickly around you, you see "
                       f"{_listing(self.scene.receptacles)}.\n\nYour task is to: {self.scene.goal}")
        return self._with_actions(observation), self.scene.goal, {
            "task_family": self.scene.family, "room": self.scene.room}

    @property
    def invalid_action_message(self) -> str:
        # Repeats the available actions: the invalid turn replaced the observation that listed them.
        return self._with_actions("Invalid action. Reply with exactly one command inside "
                                  "<answer>...</answer> that names things in this room, e.g. "
                                  "<answer>go to cabinet 1</answer>.")

    def _with_actions(self, observation: str) -> str:
        if not self.list_actions:
            return observation
        return observation + "\n" + self.action_listing()

    def visible(self, receptacle: str) -> bool:
        return receptacle_type(receptacle) not in OPENABLE or receptacle in self.opened

    def where_is(self, obj: str) -> str | None:
        """The receptacle holding `obj`, or None when the agent carries it (privileged)."""
        for receptacle, objs in self.contents.items():
            if obj in objs:
                return receptacle
        return None

    @staticmethod
    def preposition(receptacle: str) -> str:
        return "in" if receptacle_type(receptacle) in CONTAINERS else "on"

    # ---- commands --------------------------------------------------------------------------------
    def valid_actions(self) -> list[str]:
        actions = [f"go to {r}" for r in self.scene.receptacles if r != self.location]
        here = self.location
        if here is not None:
            if receptacle_type(here) in OPENABLE:
                actions.append(f"close {here}" if here in self.opened else f"open {here}")
            if self.visible(here):
                if self.holding is None:
                    actions += [f"take {o} from {here}" for o in self.contents[here]
                                if receptacle_type(o) not in FIXED]
                else:
                    actions.append(f"put {self.holding} {self.preposition(here)} {here}")
                if "desklamp 1" in self.contents[here]:
                    actions.append("use desklamp 1")
            verb = _APPLIANCE_VERB.get(receptacle_type(here))
            if verb and self.holding is not None:
                actions.append(f"{verb} {self.holding} with {here}")
            actions.append(f"examine {here}")
        if self.holding is not None:
            actions.append(f"examine {self.holding}")
        return actions + ["inventory", "look"]

    def canonical(self, action: str) -> str | None:
        """Map accepted spellings onto the canonical command; None if not a command of this scene."""
        action = " ".join(action.lower().strip().rstrip(".").split())
        if action in ("look", "inventory"):
            return action
        if action == "use desklamp 1":
            return action if "desklamp 1" in self._objects else None
        things = self._objects | self._receptacles
        for verb in ("go to ", "open ", "close ", "examine "):
            if action.startswith(verb):
                name = action[len(verb):]
                ok = name in self._receptacles or (verb == "examine " and name in things)
                return verb + name if ok else None
        if m := _TAKE.match(action):
            obj, rec = m.groups()
            return f"take {obj} from {rec}" if obj in self._objects and rec in self._receptacles else None
        if m := _PUT.match(action):
            obj, rec = m.groups()
            if obj in self._objects and rec in self._receptacles:
                return f"put {obj} {self.preposition(rec)} {rec}"
            return None
        if m := _APPLY.match(action):
            verb, obj, rec = m.groups()
            return f"{verb} {obj} with {rec}" if obj in self._objects and rec in self._receptacles else None
        return None

    def is_valid_action(self, action: str) -> bool:
        return self.scene is not None and self.canonical(action) is not None

    def _describe(self, receptacle: str) -> str:
        if receptacle_type(receptacle) in OPENABLE:
            if receptacle not in self.opened:
                return f"The {receptacle} is closed."
            return f"The {receptacle} is open. In it, you see {_listing(self.contents[receptacle])}."
        return f"On the {receptacle}, you see {_listing(self.contents[receptacle])}."

    def _execute(self, action: str) -> str:
        verb, _, rest = action.partition(" ")
        if action.startswith("go to "):
            self.location = action[len("go to "):]
            return f"You arrive at {self.location}. {self._describe(self.location)}"
        if verb == "open":
            self.opened.add(rest)
            return f"You open the {rest}. In it, you see {_listing(self.contents[rest])}."
        if verb == "close":
            self.opened.discard(rest)
            return f"You close the {rest}."
        if verb == "take":
            obj, rec = rest.split(" from ")
            self.contents[rec].remove(obj)
            self.holding = obj
            return f"You pick up the {obj} from the {rec}."
        if verb == "put":
            self.contents[self.location].append(self.holding)
            obj, self.holding = self.holding, None
            return f"You put the {obj} {self.preposition(self.location)} the {self.location}."
        if verb in _STATE_OF_VERB:
            obj = rest.split(" with ")[0]
            self.states.setdefault(obj, set()).add(_STATE_OF_VERB[verb])
            # Heating and cooling undo each other, as they would in a kitchen.
            undone = {"heat": "cool", "cool": "hot"}.get(verb)
            self.states[obj].discard(undone)
            return f"You {verb} the {obj} using the {self.location}."
        if action == "use desklamp 1":
            self.lamp_on = not self.lamp_on
            return f"You turn {'on' if self.lamp_on else 'off'} the desklamp 1."
        if verb == "examine":
            if rest in self._receptacles:
                return self._describe(rest)
            adjectives = " ".join(sorted(self.states.get(rest, ())))
            return f"This is a {adjectives + ' ' if adjectives else ''}{rest}."
        if action == "inventory":
            if not self.holding:
                return "You are not carrying anything."
            return f"You are carrying: a {self.holding}."
        # look
        if self.location is None:
            return ("You are in the middle of a room. Looking quickly around you, you see "
                    f"{_listing(self.scene.receptacles)}.")
        return f"You are facing the {self.location}. {self._describe(self.location)}"

    def solved(self) -> bool:
        """Whether the task's goal condition holds now."""
        scene = self.scene
        if scene.family == "examine":
            return (self.holding is not None and receptacle_type(self.holding) == scene.target_type
                    and self.lamp_on and self.location is not None
                    and "desklamp 1" in self.contents[self.location])
        needed = _STATE_OF_VERB.get(scene.family)
        return any(receptacle_type(o) == scene.target_type and (needed is None or
                                                                 needed in self.states.get(o, ()))
                   for r, objs in self.contents.items() if receptacle_type(r) == scene.destination_type
                   for o in objs)

    def _step(self, action: str):
        if action in self.valid_actions():
            observation = self._execute(action)
        else:
            observation = "Nothing happens."
        success = self.solved()
        extra: dict[str, Any] = {"task_family": self.scene.family}
        return self._with_actions(observation), float(success), success, success, extra
