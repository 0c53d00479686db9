"""The text-environment protocol every crl_jax environment follows.

An environment is gym-like over text. The agent (an LLM) sees a system prompt with the rules, the
goal and the first observation; each turn it writes free text from which `parse_action` extracts one
action (by default the content of the last `<answer>...</answer>`). Text that holds no valid action
is not an error: the environment answers with a clear message, counts it in `info["invalid_actions"]`,
and the turn still consumes one of `max_turns`.

`reset(seed)` is deterministic: the same seed gives the same task and the same observation sequence
for the same actions.

Environments that end each observation with the actions available now ("Available actions: ...")
can number them (`numbered_actions`): the agent may then answer with a listed action's number
alone, as choice-based agents of WebShop and ALFWorld pick among the admissible actions. A small
model can choose a number where it cannot yet copy a product code or an object name from the page.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any

ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
NUMBER_PATTERN = re.compile(r"[0-9]{1,6}")  # ASCII digits only: int() rejects some str.isdigit() ones


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one `step` returns, also usable as the gym 5-tuple via `astuple()`."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    def astuple(self):
        return self.observation, self.reward, self.terminated, self.truncated, self.info


def parse_answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` in `text`, stripped, or None."""
    matches = ANSWER_PATTERN.findall(text or "")
    if not matches:
        return None
    action = matches[-1].strip()
    return action or None


class TextEnv(abc.ABC):
    """Base class of all text environments.

    Subclasses implement `_reset(seed) -> (observation, goal, extra_info)`,
    `_step(action) -> (observation, reward, success, done, extra_info)` and `valid_actions()`,
    and set `name`, `max_turns` and `system_prompt`. The base class handles parsing, invalid
    actions, turn counting, truncation and the shape of `info`.
    """

    name: str = "base"
    max_turns: int = 30
    # The rules, the action vocabulary and the legend, shown to the agent as the system message.
    system_prompt: str = ""
    # What the agent is told when its output holds no valid action.
    invalid_action_message: str = (
        "Invalid action. Reply with exactly one action inside <answer>...</answer>."
    )

    def __init__(self, numbered_actions: bool = False):
        # Listed actions carry their number, and a number alone is an answer (module docstring).
        self.numbered_actions = numbered_actions
        self._turn = 0
        self._invalid = 0
        self._done = True
        self._goal = ""
        self._success = False

    # ---- what subclasses provide -------------------------------------------------------------
    @abc.abstractmethod
    def _reset(self, seed: int) -> tuple[str, str, dict[str, Any]]:
        """Start the episode for `seed`; returns (first observation, goal text, extra info)."""

    @abc.abstractmethod
    def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply a parsed, valid action; returns (observation, reward, success, done, extra)."""

    @abc.abstractmethod
    def valid_actions(self) -> list[str]:
        """The actions currently allowed, as the agent must write them."""

    def is_valid_action(self, action: str) -> bool:
        return action in self.valid_actions()

    def listed_actions(self) -> list[str]:
        """The actions an observation's "Available actions" list shows, in order; the numbers of
        `numbered_actions` index this list. Environments whose list differs from `valid_actions`
        (a search box shown as a template) override it."""
        return self.valid_actions()

    def action_listing(self) -> str:
        """The "Available actions: ..." line that ends an observation."""
        actions = self.listed_actions()
        if self.numbered_actions:
            actions = [f"({number}) {action}" for number, action in enumerate(actions, 1)]
        return "Available actions: " + ", ".join(actions)

    def chosen_action(self, answer: str) -> str:
        """The listed action an answer's number stands for under `numbered_actions`; any other
        answer unchanged (a number out of range stays a number, which no action matches)."""
        if self.numbered_actions and NUMBER_PATTERN.fullmatch(answer.strip()):
            listed = self.listed_actions()
            number = int(answer)
            if 1 <= number <= len(listed):
                return listed[number - 1]
        return answer

    def answer_for(self, action: str) -> str:
        """How an agent writes `action`: its number when actions are numbered and it is listed,
        else the action itself. Scripted agents answer through this, so demos match the mode."""
        if self.numbered_actions:
            listed = self.listed_actions()
            if action in listed:
                return str(listed.index(action) + 1)
        return action

    def set_training_step(self, step: int) -> None:
        """The run's current RL step, told before every reset (training and evaluation alike).
        Environments whose hidden facts drift over training (envs/doors.py) read it; the rest
        ignore it."""

    def vocabulary_texts(self) -> list[str]:
        """Every word of this environment that a few sampled episodes may miss (catalogue words,
        object names), for the tiny models' vocabulary (rollout.vocabulary). An environment whose
        words all show up in any dozen episodes keeps the default, no texts."""
        return []

    def canonical(self, action: str) -> str | None:
        """The action as `_step` takes it (accepted spellings mapped onto one form), or None when
        it is not valid now. By default: lower case, single spaces, and one of `valid_actions`."""
        action = " ".join(action.lower().split())
        return action if self.is_valid_action(action) else None

    def parse_action(self, text: str) -> str | None:
        """Extract the action from model output; None when there is none or it is not valid."""
        action = parse_answer_tag(text)
        return None if action is None else self.canonical(self.chosen_action(action))

    # ---- the protocol ------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"{self.name}: seed must be a non-negative int, got {seed!r}")
        self._turn = 0
        self._invalid = 0
        self._done = False
        self._success = False
        observation, goal, extra = self._reset(seed)
        self._goal = goal
        info = {"goal": goal, "seed": seed, "turn": 0, "success": False, "invalid_actions": 0}
        info.update(extra)
        return observation, info

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError(f"{self.name}: step() called on a finished episode; call reset()")
        self._turn += 1
        action = self.parse_action(action_text)
        if action is None:
            self._invalid += 1
            observation, reward, success, done, extra = self.invalid_action_message, 0.0, False, False, {}
        else:
            observation, reward, success, done, extra = self._step(action)
        self._success = self._success or success
        truncated = (not done) and self._turn >= self.max_turns
        self._done = done or truncated
        info = {
            "goal": self._goal,
            "turn": self._turn,
            "action": action,
            "valid_action": action is not None,
            "success": self._success,
            "invalid_actions": self._invalid,
        }
        info.update(extra)
        return observation, float(reward), bool(done), bool(truncated), info

    @property
    def goal(self) -> str:
        return self._goal

    def close(self) -> None:
        """Release external resources (subprocesses, simulators)."""


class ScriptedAgent(abc.ABC):
    """An agent that acts through the same text protocol: `act` returns model-like output text."""

    @abc.abstractmethod
    def reset(self, env: TextEnv, observation: str, info: dict[str, Any]) -> None:
        """Called after `env.reset`; experts may read privileged state from `env`."""

    @abc.abstractmethod
    def act(self, observation: str, info: dict[str, Any]) -> str:
        """Return output text holding one action, e.g. `<answer>north</answer>`."""
