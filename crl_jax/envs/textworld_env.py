"""TextWorld games ("textworld/cooking", "textworld/treasure-hunter") as ALFWorld-like text tasks.

Owns: generating a TextWorld game per (challenge, settings, seed) offline with the `textworld`
package, caching the compiled game on disk so each is generated once, playing it through
`textworld.start`, and cleaning the interpreter's output (banner, prompt, status line) into plain
observations. Reward is 1 when the game is won; a lost game (e.g. eating the wrong thing) ends the
episode as a failure. The admissible commands of each state are the valid actions.

Cache folder: `cache_dir` argument, else $CRL_JAX_TEXTWORLD_CACHE, else
<user cache dir>/crl_jax/textworld ($XDG_CACHE_HOME or ~/.cache). Games are keyed by challenge,
settings, seed and the textworld version; writes go through a temporary folder and an atomic rename,
so concurrent workers can share one cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from typing import Any

from crl_jax.envs.base import TextEnv, parse_answer_tag

try:
    import textworld
    from textworld.challenges import tw_cooking, treasure_hunter
except ImportError:  # the registry only imports this module when a TextWorld env is made
    textworld = None

# Small defaults so a game generates in ~1-2 s: one room's worth of cooking with a few rooms to
# search, and a medium treasure hunt (closed doors and containers, short quest).
DEFAULT_SETTINGS = {
    "cooking": {"recipe": 1, "take": 1, "go": 6, "open": True, "cook": True, "cut": False,
                "drop": False},
    "treasure_hunter": {"level": 13},
}
_BANNER_LINE = re.compile(r"^[\s$\\/|_]*\$\$[\s$\\/|_<>]*$")

SYSTEM_PROMPT = """You are playing a text adventure in a house. Read the goal in the first message \
and complete it. Typical commands: go <north|south|east|west>, open <thing>, close <thing>, \
take <object> [from <container>], put <object> on <supporter>, insert <object> into <container>, \
unlock <door> with <key>, examine <thing>, look, inventory; in kitchens also cook <food> with \
<stove|oven>, slice/dice/chop <food> with knife, prepare meal, eat meal.
Each observation lists the available actions; choose one of them.
Think briefly, then reply with exactly one command inside <answer>...</answer>, e.g. \
<answer>go north</answer>."""


def default_cache_dir() -> str:
    override = os.environ.get("CRL_JAX_TEXTWORLD_CACHE")
    if override:
        return override
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "crl_jax", "textworld")


def clean_output(text: str) -> str:
    """Interpreter output without the welcome banner, the '>' prompt and the status line."""
    # The interpreter's end-of-game screen (score summary, RESTART/QUIT prompt) is not part of the task.
    text = text.split("*** The End ***")[0]
    lines = text.splitlines()
    banner_end = max((i for i, line in enumerate(lines) if _BANNER_LINE.match(line)), default=-1)
    kept = [line.rstrip() for line in lines[banner_end + 1:] if not line.lstrip().startswith(">")]
    cleaned = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    return cleaned


def _require_textworld() -> None:
    if textworld is None:
        raise ImportError("TextWorld environments need the `textworld` package: pip install textworld")


class TextWorldEnv(TextEnv):
    """One generated TextWorld game per seed, played through the text protocol."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, challenge: str = "cooking", settings: dict[str, Any] | None = None,
                 cache_dir: str | None = None, max_turns: int = 40, list_actions: bool = True):
        super().__init__()
        _require_textworld()
        if challenge not in DEFAULT_SETTINGS:
            raise ValueError(f"textworld: unknown challenge {challenge!r}; known: {sorted(DEFAULT_SETTINGS)}")
        self.challenge = challenge
        self.settings = {**DEFAULT_SETTINGS[challenge], **(settings or {})}
        self.cache_dir = cache_dir or default_cache_dir()
        self.max_turns = max_turns
        self.list_actions = list_actions
        self.name = "textworld/" + challenge.replace("_", "-")
        self._game = None
        self.game_state = None
        self.infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True,
                                        lost=True, score=True, max_score=True, objective=True)

    # ---- game files ----------------------------------------------------------------------------
    def game_path(self, seed: int) -> str:
        key = json.dumps({"challenge": self.challenge, "settings": self.settings, "seed": seed,
                          "textworld": textworld.__version__}, sort_keys=True)
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        return os.path.join(self.cache_dir, f"{self.challenge}-seed{seed}-{digest}.z8")

    def ensure_game(self, seed: int) -> str:
        """Path of the compiled game for `seed`, generating it on first use."""
        path = self.game_path(seed)
        if os.path.isfile(path) and os.path.isfile(path[:-3] + ".json"):
            return path
        os.makedirs(self.cache_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".gen-", dir=self.cache_dir)
        try:
            options = textworld.GameOptions()
            options.seeds = seed
            options.path = os.path.join(tmp, "game.z8")
            options.force_recompile = True
            if self.challenge == "cooking":
                game = tw_cooking.cooking.make({**self.settings, "recipe_seed": seed, "split": None},
                                               options)
            else:
                game = treasure_hunter.make(self.settings, options)
            with warnings.catch_warnings():  # compiling replays the walkthrough: same noise as _reset
                warnings.filterwarnings("ignore", message=".*is not fully supported.*")
                compiled = textworld.generator.compile_game(game, options)
            # The .json is renamed first: a present .z8 then implies a complete pair.
            os.replace(os.path.join(tmp, "game.json"), path[:-3] + ".json")
            os.replace(compiled, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    # ---- episode -------------------------------------------------------------------------------
    def _reset(self, seed: int):
        path = self.ensure_game(seed)
        self.close()
        with warnings.catch_warnings():
            # The interpreter warns that its own score tracking is off for generated games; won/lost
            # come from TextWorld's quest tracking instead, so the warning is noise.
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            self._game = textworld.start(path, request_infos=self.infos)
            self.game_state = self._game.reset()
        goal = clean_output(self.game_state.objective or "")
        observation = clean_output(self.game_state.feedback)
        return self._with_actions(observation), goal, {"max_score": self.game_state.max_score}

    def _with_actions(self, observation: str) -> str:
        if not self.list_actions or self.game_state is None or self.game_state.done:
            return observation
        return observation + "\nAvailable actions: " + ", ".join(self.valid_actions())

    @property
    def invalid_action_message(self) -> str:
        return ("Invalid action. Reply with exactly one of the available actions inside "
                "<answer>...</answer>." + self._with_actions(""))

    def valid_actions(self) -> list[str]:
        if self.game_state is None:
            return []
        return list(self.game_state.admissible_commands or [])

    def parse_action(self, text: str) -> str | None:
        action = parse_answer_tag(text)
        if action is None:
            return None
        # Admissible commands keep the game's capitals ("take Advent Calendar"); match ignoring case.
        lookup = {" ".join(c.lower().split()): c for c in self.valid_actions()}
        return lookup.get(" ".join(action.lower().split()))

    def policy_commands(self) -> list[str]:
        """The game's own optimal remaining commands from the current state (privileged)."""
        return list(self.game_state.policy_commands or []) if self.game_state is not None else []

    def _step(self, action: str):
        self.game_state, _, _ = self._game.step(action)
        state = self.game_state
        success, done = bool(state.won), bool(state.won or state.lost)
        extra = {"score": state.score, "max_score": state.max_score, "lost": bool(state.lost)}
        return self._with_actions(clean_output(state.feedback)), float(success), success, done, extra

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game = None
