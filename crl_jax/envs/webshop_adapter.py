"""Adapter to the real WebShop ("webshop/data") for users who have WebShop and its data locally.

Owns: importing WebShop's `WebAgentTextEnv` (text observation mode), mapping a seed to a goal
(session index = seed mod number of goals, WebShop's own deterministic goal order), and the text
side that needs no data: turning WebShop's " [SEP] "-joined page text into lines with the available
actions appended, listing available actions, and parsing `search[...]` / `click[...]` from the
agent's output (the same action grammar as the in-repo shop env).

Needs: WebShop's `web_agent_site` package, i.e. a checkout of github.com/princeton-nlp/WebShop after
its setup.sh (product data, goals and the search index), importable from PYTHONPATH or from
$WEBSHOP_ROOT. The product file defaults to WebShop's DEFAULT_FILE_PATH; pass file_path= to change it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from crl_jax.envs.base import TextEnv, parse_answer_tag
from crl_jax.envs.shop import ACTION_PATTERN

SYSTEM_PROMPT = """You are web shopping (WebShop) for the instruction shown on the page. Each \
observation ends with the available actions. Use search[<keywords>] when a search box is available \
and click[<value>] for one of the listed clickables (product ids, options, Next >, < Prev, \
Back to Search, Description, Features, Reviews, Buy Now). Select every option the instruction asks \
for before Buy Now.
Think briefly, then reply with exactly one action inside <answer>...</answer>, e.g. \
<answer>search[blue running shoes]</answer>."""


def available_action_strings(available: dict[str, Any]) -> list[str]:
    """WebShop's {'has_search_bar', 'clickables'} as action strings, search first."""
    actions = ["search[<keywords>]"] if available.get("has_search_bar") else []
    return actions + [f"click[{c}]" for c in available.get("clickables", []) if c != "search"]


def format_observation(raw: str, available: dict[str, Any] | None) -> str:
    text = "\n".join(part.strip() for part in (raw or "").split("[SEP]") if part.strip())
    if available is not None:
        text += "\nAvailable actions: " + ", ".join(available_action_strings(available))
    return text


def parse_webshop_action(text: str, available: dict[str, Any]) -> str | None:
    """Canonical `search[kw]` / `click[value]` if the output holds one that is available now."""
    action = parse_answer_tag(text)
    if action is None:
        return None
    match = ACTION_PATTERN.match(" ".join(action.split()))
    if match is None:
        return None
    verb, arg = match.group(1).lower(), match.group(2).strip()
    if verb == "search":
        ok = available.get("has_search_bar") and arg and arg != "<keywords>"
        return f"search[{arg}]" if ok else None
    label = arg.lower()
    # WebShop lower-cases the clicked text before its own lookup, so matching is case-insensitive.
    clickables = {c.lower() for c in available.get("clickables", []) if c != "search"}
    return f"click[{label}]" if label in clickables else None


def _import_webshop():
    root = os.environ.get("WEBSHOP_ROOT")
    if root and root not in sys.path:
        sys.path.insert(0, root)
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        from web_agent_site.utils import DEFAULT_FILE_PATH
    except ImportError as error:
        raise ImportError(
            "webshop/data needs WebShop's `web_agent_site` package: clone "
            "github.com/princeton-nlp/WebShop, run its setup.sh (product data, goals, search index) "
            "and put the checkout on PYTHONPATH or set $WEBSHOP_ROOT to it; import failed: "
            f"{error}") from error
    return WebAgentTextEnv, DEFAULT_FILE_PATH


class WebShopEnv(TextEnv):
    """WebShop's text environment behind the crl_jax protocol; success when the reward is 1."""

    name = "webshop/data"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, file_path: str | None = None, num_products: int | None = None,
                 human_goals: bool = True, max_turns: int = 15):
        super().__init__()
        text_env_cls, default_path = _import_webshop()
        file_path = file_path or default_path
        if not os.path.exists(file_path):
            raise FileNotFoundError(
                f"webshop/data: WebShop product data not found at {file_path}; run WebShop's "
                "setup.sh to download it, or pass file_path=")
        self.max_turns = max_turns
        self._env = text_env_cls(observation_mode="text", file_path=file_path,
                                 num_products=num_products, human_goals=human_goals)
        self._available: dict[str, Any] = {}

    def _reset(self, seed: int):
        num_goals = len(self._env.server.goals)
        observation, _ = self._env.reset(session=seed % num_goals)
        self._available = self._env.get_available_actions()
        goal = self._env.get_instruction_text()
        return format_observation(observation, self._available), goal, {"goal_index": seed % num_goals}

    def valid_actions(self) -> list[str]:
        # Free-text search is checked by parse_action; only concrete clicks are listed here.
        return [a for a in available_action_strings(self._available) if a.startswith("click[")]

    def parse_action(self, text: str) -> str | None:
        return parse_webshop_action(text, self._available)

    def _step(self, action: str):
        observation, reward, done, _ = self._env.step(action)
        self._available = self._env.get_available_actions()
        success = bool(done) and reward >= 1.0 - 1e-9
        return format_observation(observation, self._available), float(reward), success, bool(done), {}
