"""The drifting-doors diagnostic: a task family in which experience is necessary.

An episode starts in the north or the south hall (by seed). Five doors (red, blue, green, white,
black) are listed in an order the seed shuffles; in each hall exactly one opens, and the agent has
two tries. Each property is there for the comparison of Comp. RL with GRPO and static experience
(docs/diagnostic.md):

1. **The useful fact is in earlier episodes, not in the observation.** Which door opens in a hall
   is the same for every episode of that hall, and shows only in a trajectory that opened it.
2. **It drifts.** Every `drift_every` RL steps each hall's open door moves to another one
   (`open_door`), so a bank that is never updated goes stale; the run tells its environments the
   current step (`set_training_step`), evaluations included.
3. **A trajectory holds several facts, one of them useful.** Each episode also shows the hall's
   clock and the doors found locked; `info["facts"]` lists them as sentences. The warm start's
   summariser copies one of them at random (warm_start.lessons), so which one to write must come
   from the extractor's reward.
4. **Without experience the agent can only explore:** two guesses among five doors succeed with
   probability 0.4. The scripted agent explores so, unless advice names the open door.
"""

from __future__ import annotations

import random
import re
from typing import Any

from crl_jax.envs.base import ScriptedAgent, TextEnv

HALLS = ("north", "south")
DOORS = ("red", "blue", "green", "white", "black")
HOURS = tuple(str(h) for h in range(1, 13))
DRIFT_EVERY = 6  # RL steps between drifts of the registered diag/doors
_ADVICE = re.compile(r"the (\w+) hall the (\w+) door (opens|is locked)", re.IGNORECASE)


def open_door(hall: str, step: int, drift_every: int) -> str:
    """The door that opens in `hall` at RL step `step`: a different one after every drift."""
    phase = step // drift_every if drift_every > 0 else 0
    return DOORS[(2 * HALLS.index(hall) + 3 * phase) % len(DOORS)]


def fact_opens(hall: str, door: str) -> str:
    return f"In the {hall} hall the {door} door opens."


def fact_locked(hall: str, door: str) -> str:
    return f"In the {hall} hall the {door} door is locked."


def fact_clock(hall: str, hour: str) -> str:
    return f"In the {hall} hall the clock shows {hour}."


class DoorsEnv(TextEnv):
    name = "diag/doors"
    max_turns = 2
    system_prompt = ("You stand in a hall with five doors. One of them opens, the others are locked. "
                     "Open a door by writing its colour inside <answer>...</answer>, such as "
                     "<answer>red</answer>. You have two tries.")

    def __init__(self, drift_every: int = DRIFT_EVERY, numbered_actions: bool = False):
        super().__init__(numbered_actions)
        if drift_every < 0:
            raise ValueError(f"drift_every must be >= 0, got {drift_every}")
        self.drift_every = drift_every
        self.training_step = 0

    def set_training_step(self, step: int) -> None:
        self.training_step = int(step)

    def solving_fact(self) -> str:
        """The fact that solves the current episode (the advice its expert follows)."""
        return fact_opens(self.hall, self.door)

    def current_facts(self, step: int) -> list[str]:
        """The sentences that are true at RL step `step`: which door opens in each hall."""
        return [fact_opens(hall, open_door(hall, step, self.drift_every)) for hall in HALLS]

    def _reset(self, seed: int) -> tuple[str, str, dict[str, Any]]:
        rng = random.Random(seed)
        self.hall = HALLS[seed % len(HALLS)]
        self.order = rng.sample(DOORS, len(DOORS))
        self.hour = HOURS[rng.randrange(len(HOURS))]
        self.door = open_door(self.hall, self.training_step, self.drift_every)
        self.facts = [fact_clock(self.hall, self.hour)]
        observation = (f"You are in the {self.hall} hall. The clock shows {self.hour}. "
                       f"Doors: {', '.join(self.order)}.")
        return observation, f"leave the {self.hall} hall", {"facts": tuple(self.facts)}

    def valid_actions(self) -> list[str]:
        return list(self.order)

    def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == self.door:
            self.facts.append(fact_opens(self.hall, action))
            return (f"The {action} door opens and you leave the hall.", 1.0, True, True,
                    {"facts": tuple(self.facts)})
        self.facts.append(fact_locked(self.hall, action))
        return f"The {action} door is locked.", 0.0, False, False, {"facts": tuple(self.facts)}

    def vocabulary_texts(self) -> list[str]:
        return [" ".join(HALLS + DOORS + HOURS), fact_opens("north", "red"), fact_locked("north", "red"),
                fact_clock("north", "1"), "The red door opens and you leave the hall."]

    def all_facts(self) -> list[str]:
        """Every sentence an episode can show: the summariser's possible lessons."""
        return ([fact_opens(h, d) for h in HALLS for d in DOORS]
                + [fact_locked(h, d) for h in HALLS for d in DOORS]
                + [fact_clock(h, t) for h in HALLS for t in HOURS])

    def make_expert(self) -> "AdviceFollower":
        return AdviceFollower()


class AdviceFollower(ScriptedAgent):
    """Opens the door that advice says opens; avoids doors it says are locked; otherwise tries
    untried doors in a random order (it knows no more than an agent without experience)."""

    def __init__(self):
        self.advice: list[tuple[str, str, str]] = []

    def advise(self, text: str) -> None:
        self.advice = [(h.lower(), d.lower(), what.lower()) for h, d, what in _ADVICE.findall(text)]

    def reset(self, env: DoorsEnv, observation: str, info: dict[str, Any]) -> None:
        self.env = env
        self.rng = random.Random(info["seed"] * 7 + 1)
        self.tried: set[str] = set()

    def act(self, observation: str, info: dict[str, Any]) -> str:
        hall = self.env.hall
        opens = [d for h, d, what in self.advice if h == hall and what == "opens"]
        locked = {d for h, d, what in self.advice if h == hall and what == "is locked"}
        untried = [d for d in self.env.order if d not in self.tried]
        choice = next((d for d in opens if d in untried), None)
        if choice is None:
            preferred = [d for d in untried if d not in locked] or untried
            choice = preferred[self.rng.randrange(len(preferred))]
        self.tried.add(choice)
        return f"<answer>{self.env.answer_for(choice)}</answer>"
