"""MiniHack behind the text protocol: the paper's four tasks (Room, MazeWalk, KeyRoom, River).

Plus one variant of the paper's Room task, `room-ultimate-lit-5x5`: the same 5x5 room with a
random start, goal, monster and hidden trap, but lit, so the goal is in view from the start. It is
the CPU default because tiny models cannot learn the dark room's exploration in minutes (README,
"The default run").

Owns: building the NetHack Learning Environment for a task, seeding it so that a seed fixes the level
and the whole game (core, display and level-generator RNGs, moon phase), rendering the game message,
the 9x9 crop around the agent and a "You see" line of what is in view as text (the legend is in
the system prompt), and mapping action words
("north", "pick up", "apply", ...) to NLE actions.

It also offers `privileged_map()` for scripted experts: the same level generated in a second,
hidden NLE instance whose level description is lit and premapped, so the whole initial map (walls,
stairs, traps, keys, boulders) is visible there. The agent never sees it.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from crl_jax.envs.base import TextEnv

with warnings.catch_warnings():
    # minihack imports pkg_resources, which warns about its own deprecation.
    warnings.simplefilter("ignore")
    import gymnasium as gym
    import minihack  # noqa: F401  (registers the MiniHack gym ids)
    from minihack.envs.room import MiniHackRoom
    from nle import nethack


class RoomUltimateLit5x5(MiniHackRoom):
    """MiniHack-Room-Ultimate-5x5 with the lights on (MiniHack registers no such variant)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, size=5, random=True, lit=True, n_monster=1, n_trap=1, **kwargs)


_LIT_ROOM_ID = "CrlJax-Room-Ultimate-Lit-5x5-v0"
if _LIT_ROOM_ID not in gym.registry:
    gym.register(id=_LIT_ROOM_ID, entry_point=f"{__name__}:RoomUltimateLit5x5")

# task name -> (gym id, default max_turns, goal text). 30 turns is the paper's MiniHack budget; River
# gets more because even the optimal push plan takes ~40 steps.
TASKS: dict[str, tuple[str, int, str]] = {
    "room-ultimate-5x5": (
        "MiniHack-Room-Ultimate-5x5-v0",
        30,
        "Reach the staircase down (>) in a dark 5x5 room. The room also holds a monster and a "
        "hidden teleport trap.",
    ),
    "room-ultimate-lit-5x5": (
        _LIT_ROOM_ID,
        30,
        "Reach the staircase down (>) in a lit 5x5 room. The room also holds a monster and a "
        "hidden teleport trap.",
    ),
    "mazewalk-9x9": (
        "MiniHack-MazeWalk-9x9-v0",
        30,
        "Find the staircase down (>) somewhere in a 9x9 maze and step onto it.",
    ),
    "keyroom-dark-s5": (
        "MiniHack-KeyRoom-Dark-S5-v0",
        30,
        "Find the key (() in the dark room and pick it up, stand next to the locked door (+) of the "
        "small inner room and apply the key, then reach the staircase down (>) inside that room.",
    ),
    "river-narrow": (
        "MiniHack-River-Narrow-v0",
        100,
        "Reach the staircase down (>) on the far side of the river (}). You cannot swim: push "
        "boulders (`) into the water to fill it and make a crossing.",
    ),
}

_DIRECTION_WORDS = {
    nethack.CompassDirection.N: "north",
    nethack.CompassDirection.E: "east",
    nethack.CompassDirection.S: "south",
    nethack.CompassDirection.W: "west",
    nethack.CompassDirection.NE: "northeast",
    nethack.CompassDirection.SE: "southeast",
    nethack.CompassDirection.SW: "southwest",
    nethack.CompassDirection.NW: "northwest",
}
_COMMAND_WORDS = {nethack.Command.PICKUP: "pick up", nethack.Command.APPLY: "apply"}
# (dx, dy) of each direction word; y grows southwards as on the NetHack screen.
DIRECTION_DELTAS = {
    "north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0),
    "northeast": (1, -1), "southeast": (1, 1), "southwest": (-1, 1), "northwest": (-1, -1),
}

LEGEND = (
    "Legend: @ you; . floor; > staircase down (the goal); | and - walls; + closed door; "
    "| or - in a wall gap may be an open door; ( an item such as a key; ` boulder; } water; "
    "^ a trap you have found; letters (a-z, A-Z) are monsters; a blank is rock or unseen."
)
# Map symbols named, with their offset from the agent, in each observation's "You see" line (the
# text counterpart of the screen descriptions the paper's environment passes along).
_NOTABLE = ((">", "staircase down"), ("<", "staircase up"), ("(", "item"), ("+", "door"),
            ("`", "boulder"), ("^", "trap"))
_OBS_KEYS = ("glyphs", "chars", "chars_crop", "message", "blstats", "inv_strs")


def _decode(row: np.ndarray) -> str:
    return bytes(row).decode("latin-1").rstrip("\x00")


def _offset_words(dx: int, dy: int) -> str:
    """ "2 south 1 east (southeast)": the offset in squares, then the compass direction."""
    vertical = "south" if dy > 0 else "north" if dy < 0 else ""
    horizontal = "east" if dx > 0 else "west" if dx < 0 else ""
    parts = [f"{abs(d)} {word}" for d, word in ((dy, vertical), (dx, horizontal)) if d]
    return f"{' '.join(parts)} ({vertical}{horizontal})" if parts else "here"


def describe_surroundings(rows: list[str]) -> str:
    """Each notable thing on the crop with its offset and direction from the agent, nearest
    first and the goal (>) last, e.g. "monster (j) 1 north (north); staircase down (>) 2 south
    1 east (southeast)". The goal's direction is then always the observation's last word, right
    before the agent's reply, where even a tiny model finds it; in parentheses, a word-level
    tokenizer gives it the same token as the action word in "<answer>southeast</answer>"."""
    agent = next(((r.index("@"), y) for y, r in enumerate(rows) if "@" in r), None)
    if agent is None:
        return "nothing (you are not on the map)"
    names = dict(_NOTABLE)
    found = []
    for y, row in enumerate(rows):
        for x, char in enumerate(row):
            name = names.get(char) or ("monster" if char.isalpha() else None)
            if name is not None:
                dx, dy = x - agent[0], y - agent[1]
                rank = (char == ">", max(abs(dx), abs(dy)))
                found.append((rank, f"{name} ({char}) {_offset_words(dx, dy)}"))
    return "; ".join(text for _, text in sorted(found)) or "nothing special"


class MiniHackEnv(TextEnv):
    """One MiniHack task as a text environment; `task` is a key of `TASKS`."""

    def __init__(self, task: str = "room-ultimate-5x5", max_turns: int | None = None):
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"unknown MiniHack task {task!r}; known: {', '.join(sorted(TASKS))}")
        self.task = task
        self.gym_id, default_turns, self.goal_text = TASKS[task]
        self.name = f"minihack/{task}"
        self.max_turns = int(max_turns or default_turns)
        # MiniHack's own step limits (100-350) lie above every default max_turns here.
        self._nle = self._make_nle()
        self._actions = {}
        for index, action in enumerate(self._nle.actions):
            word = _DIRECTION_WORDS.get(action) or _COMMAND_WORDS.get(action)
            if word is None:
                raise RuntimeError(f"{self.gym_id}: unexpected action {action!r} in its action set")
            self._actions[word] = index
        self._shadow = None
        self._seed = None
        self.last_obs: dict[str, np.ndarray] | None = None
        self.system_prompt = self._system_prompt()

    def _make_nle(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make(
                self.gym_id,
                observation_keys=_OBS_KEYS,
                fix_moon_phase=True,
            )
        return env.unwrapped

    def _system_prompt(self) -> str:
        actions = ", ".join(self._actions)
        return (
            "You play a small NetHack (MiniHack) task. Each turn you see the game message, the 9x9 "
            "map around you (you are at the centre, @) and what is in view with its offset and "
            "direction from you (e.g. 2 south 1 east (southeast)). Moving into a monster attacks "
            "it. "
            "Diagonal moves are allowed except through doorways. Boulders move when you walk into "
            "them if the square behind is free.\n"
            f"Task: {self.goal_text}\n"
            f"Actions: {actions}.\n"
            f"{LEGEND}\n"
            "Think briefly, then give exactly one action as <answer>action</answer>, e.g. "
            "<answer>north</answer>."
        )

    def valid_actions(self) -> list[str]:
        return list(self._actions)

    # ---- rendering -------------------------------------------------------------------------------
    def render_observation(self, obs: dict[str, np.ndarray]) -> str:
        message = _decode(obs["message"]).strip() or "(no message)"
        rows = [_decode(row) for row in obs["chars_crop"]]
        crop = "\n".join(rows)
        # The legend is in the system prompt and "You see" names what matters, so an observation
        # carries no legend of its own (it cost a fifth of each observation's tokens).
        # "You see" comes last, right before the agent's reply, where small models attend best.
        return (f"Message: {message}\nMap around you:\n{crop}\n"
                f"You see: {describe_surroundings(rows)}")

    @property
    def player_xy(self) -> tuple[int, int]:
        """The agent's (x, y) on the full 21x79 map."""
        blstats = self.last_obs["blstats"]
        return int(blstats[0]), int(blstats[1])

    def full_chars(self) -> np.ndarray:
        """What the agent's NetHack screen currently shows, as a 21x79 array of characters."""
        return np.vectorize(chr)(self.last_obs["chars"])

    def has_key(self) -> bool:
        return any("key" in _decode(s).lower() for s in self.last_obs["inv_strs"])

    # ---- the protocol ----------------------------------------------------------------------------
    def _seed_and_reset(self, env, seed: int) -> dict[str, np.ndarray]:
        # reseed=False: NetHack otherwise reseeds from true randomness mid-game; lgen fixes the level.
        env.seed(core=seed, disp=seed, reseed=False, lgen=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, _ = env.reset()
        return obs

    def _reset(self, seed: int):
        self._seed = seed
        self.last_obs = self._seed_and_reset(self._nle, seed)
        return self.render_observation(self.last_obs), self.goal_text, {"task": self.task}

    def _step(self, action: str):
        obs, reward, terminated, truncated, info = self._nle.step(self._actions[action])
        self.last_obs = obs
        status = info.get("end_status")
        success = bool(status == self._nle.StepStatus.TASK_SUCCESSFUL)
        done = bool(terminated or truncated)
        text = self.render_observation(obs)
        if done and not success:
            text += "\nThe episode is over: you died or the game ended."
        elif success:
            text += "\nYou reached the staircase. Task complete."
        status_name = getattr(status, "name", str(status))
        return text, (1.0 if success else 0.0), success, done, {"end_status": status_name}

    # ---- privileged view for scripted experts ----------------------------------------------------
    def privileged_map(self) -> np.ndarray:
        """The full initial map of the current episode's level (21x79 characters).

        Built in a hidden NLE instance from this level's description with every region lit and
        the level premapped, reset with the same seeds, so the level generator lays out the same
        level. Monsters move, so only the static layout (and initial item places) is meaningful.
        """
        if self._seed is None:
            raise RuntimeError(f"{self.name}: privileged_map() needs reset() first")
        if self._shadow is None:
            self._shadow = self._make_nle()
            with open(os.path.join(self._nle.nethack._vardir, "mylevel.des")) as f:
                des = f.read()
            des = des.replace("unlit", "lit")
            if "FLAGS:" in des:
                des = des.replace("FLAGS:", "FLAGS:premapped,", 1)
            else:
                des = des.replace('LEVEL: "mylevel"\n', 'LEVEL: "mylevel"\nFLAGS:premapped\n', 1)
            self._shadow.update(des)
        obs = self._seed_and_reset(self._shadow, self._seed)
        if tuple(obs["blstats"][:2]) != tuple(self.last_obs["blstats"][:2]) and self._turn == 0:
            raise RuntimeError(
                f"{self.name}: hidden map disagrees with the game for seed {self._seed}")
        return np.vectorize(chr)(obs["chars"])

    def close(self) -> None:
        for env in (self._nle, self._shadow):
            if env is not None:
                env.close()
        self._shadow = None
