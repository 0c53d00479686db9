"""Adapter to the real ALFWorld text games ("alfworld/data") for users who have its data locally.

Owns: locating the ALFWorld data, listing its solvable games through `alfworld`'s public
`AlfredTWEnv` (sorted, so a seed always maps to the same game), playing one game per episode with
`textworld.start` and ALFWorld's `AlfredDemangler`/`AlfredInfos` wrappers, and the text side that
needs no data: cleaning observations, extracting the goal, listing admissible commands, parsing the
agent's action. The handcoded expert plan of ALFWorld is exposed for `ALFWorldExpert`.

Needs: the `alfworld` package (`pip install alfworld`) and its data (`alfworld-download`), found at
the `data_dir` argument, else $ALFWORLD_DATA, else ~/.cache/alfworld (ALFWorld's own default):
json_2.1.1/{train,valid_seen,valid_unseen} and logic/{alfred.pddl,alfred.twl2}.
Splits: "train", "eval_in_distribution" (valid_seen), "eval_out_of_distribution" (valid_unseen,
the 134 held-out games).
"""

from __future__ import annotations

import os
import re
from typing import Any

from crl_jax.envs.base import ScriptedAgent, TextEnv, parse_answer_tag

SPLIT_DIRS = {"train": "train", "eval_in_distribution": "valid_seen",
              "eval_out_of_distribution": "valid_unseen"}
_WELCOME = re.compile(r"^-= Welcome to TextWorld, ALFRED! =-\s*", re.MULTILINE)
_TASK = re.compile(r"Your task is to:\s*(.+)")

SYSTEM_PROMPT = """You are an agent in a household (ALFWorld). Complete the task given after \
"Your task is to:". Each observation ends with the available actions; choose exactly one of them, \
written as listed (e.g. go to cabinet 1, open drawer 2, take mug 1 from countertop 1, \
move mug 1 to coffeemachine 1, heat egg 1 with microwave 1, use desklamp 1).
Think briefly, then reply with exactly one action inside <answer>...</answer>."""


def default_data_dir() -> str:
    return os.environ.get("ALFWORLD_DATA") or os.path.join(os.path.expanduser("~"), ".cache", "alfworld")


def clean_observation(raw: str) -> str:
    """ALFWorld's raw text without the TextWorld welcome banner."""
    return _WELCOME.sub("", raw or "").strip()


def extract_goal(raw: str) -> str:
    match = _TASK.search(raw or "")
    return match.group(1).strip() if match else ""


def format_observation(raw: str, admissible: list[str] | None) -> str:
    """What the agent sees: the cleaned text, then the admissible commands (if given)."""
    text = clean_observation(raw)
    if admissible:
        text += "\nAvailable actions: " + ", ".join(admissible)
    return text


def parse_command(text: str, admissible: list[str]) -> str | None:
    """The admissible command inside the last <answer>...</answer> (case/space-insensitive)."""
    action = parse_answer_tag(text)
    if action is None:
        return None
    action = " ".join(action.lower().split())
    lookup = {" ".join(c.lower().split()): c for c in admissible}
    return lookup.get(action)


def build_config(data_dir: str) -> dict[str, Any]:
    """The subset of ALFWorld's base_config.yaml that `AlfredTWEnv` reads when listing games."""
    json_dir = os.path.join(data_dir, "json_2.1.1")
    return {
        "env": {"type": "AlfredTWEnv", "goal_desc_human_anns_prob": 0.0, "regen_game_files": False,
                "task_types": [1, 2, 3, 4, 5, 6], "domain_randomization": False,
                "expert_type": "handcoded"},
        "dataset": {"data_path": os.path.join(json_dir, "train"),
                    "eval_id_data_path": os.path.join(json_dir, "valid_seen"),
                    "eval_ood_data_path": os.path.join(json_dir, "valid_unseen"),
                    "num_train_games": -1, "num_eval_games": -1},
        "logic": {"domain": os.path.join(data_dir, "logic", "alfred.pddl"),
                  "grammar": os.path.join(data_dir, "logic", "alfred.twl2")},
        "general": {"training_method": "dagger"},
    }


def check_data(data_dir: str, split: str) -> None:
    """Raise FileNotFoundError naming every missing ALFWorld path."""
    needed = [os.path.join(data_dir, "json_2.1.1", SPLIT_DIRS[split]),
              os.path.join(data_dir, "logic", "alfred.pddl"),
              os.path.join(data_dir, "logic", "alfred.twl2")]
    missing = [p for p in needed if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(
            "alfworld/data: ALFWorld data not found: missing " + ", ".join(missing)
            + ". Download it with `alfworld-download` and point $ALFWORLD_DATA (or data_dir=) at it.")


class ALFWorldEnv(TextEnv):
    """One ALFWorld game per seed (game index = seed mod number of games); reward 1 when won."""

    name = "alfworld/data"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, split: str = "eval_out_of_distribution", data_dir: str | None = None,
                 max_turns: int = 40):
        super().__init__()
        if split not in SPLIT_DIRS:
            raise ValueError(f"alfworld/data: unknown split {split!r}; known: {sorted(SPLIT_DIRS)}")
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import (AlfredDemangler, AlfredInfos,
                                                                   AlfredTWEnv)
        except ImportError as error:
            raise ImportError(
                "alfworld/data needs the `alfworld` package (pip install alfworld) and its data "
                f"(alfworld-download, then set $ALFWORLD_DATA); import failed: {error}") from error
        self.data_dir = data_dir or default_data_dir()
        check_data(self.data_dir, split)
        self._textworld, self._wrappers = textworld, (AlfredDemangler, AlfredInfos)
        self.split = split
        self.max_turns = max_turns
        self.game_files = sorted(AlfredTWEnv(build_config(self.data_dir), train_eval=split).game_files)
        if not self.game_files:
            raise FileNotFoundError(f"alfworld/data: no solvable games under {self.data_dir} for {split}")
        self._game = None
        self.state = None

    def _reset(self, seed: int):
        self.close()
        game_file = self.game_files[seed % len(self.game_files)]
        demangler, infos_wrapper = self._wrappers
        infos = self._textworld.EnvInfos(won=True, admissible_commands=True, expert_type="handcoded",
                                         expert_plan=True, extras=["gamefile"])
        self._game = self._textworld.start(game_file, request_infos=infos,
                                           wrappers=[demangler(shuffle=False), infos_wrapper])
        self.state = self._game.reset()
        raw = self.state.feedback
        return format_observation(raw, self.valid_actions()), extract_goal(raw), {"gamefile": game_file}

    def valid_actions(self) -> list[str]:
        return list(self.state["admissible_commands"] or []) if self.state is not None else []

    def parse_action(self, text: str) -> str | None:
        return parse_command(text, self.valid_actions())

    def expert_plan(self) -> list[str]:
        """ALFWorld's handcoded expert plan from the current state (privileged)."""
        return list(self.state.get("expert_plan") or []) if self.state is not None else []

    def _step(self, action: str):
        self.state, _, done = self._game.step(action)
        won = bool(self.state["won"])
        return (format_observation(self.state.feedback, self.valid_actions()), float(won), won,
                bool(done or won), {})

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game = None


class ALFWorldExpert(ScriptedAgent):
    """Follows ALFWorld's handcoded expert plan."""

    def reset(self, env: ALFWorldEnv, observation: str, info: dict[str, Any]) -> None:
        self.env = env

    def act(self, observation: str, info: dict[str, Any]) -> str:
        plan = self.env.expert_plan()
        return f"<answer>{plan[0] if plan else 'look'}</answer>"
