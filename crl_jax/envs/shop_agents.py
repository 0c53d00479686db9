"""Scripted expert and random agent for the shop environment.

The expert is privileged: it knows which products fully satisfy the goal. It searches with the
instruction's attribute and category words (as a sensible shopper would), opens the first result
that satisfies the goal (paging on if needed), clicks every requested option and buys. If the
keyword search does not surface a satisfying product within a few pages, it searches the title of
the product the goal was drawn from, which ranks that product first.

The random agent searches with the raw instruction (the only free text it has), then clicks
uniformly among the labels of each page.
"""

from __future__ import annotations

from typing import Any

from crl_jax.envs.base import ScriptedAgent, TextEnv
from crl_jax.envs.random_agent import RandomAgent
from crl_jax.envs.shop import BACK, BUY, NEXT, PREV, ShopEnv
from crl_jax.envs.shop_catalog import CATEGORIES, fully_satisfies


class ShopExpert(ScriptedAgent):
    """Goal-satisfying shopper using privileged product knowledge."""

    def __init__(self, max_pages: int = 3):
        self.max_pages = max_pages

    def reset(self, env: ShopEnv, observation: str, info: dict[str, Any]) -> None:
        if not isinstance(env, ShopEnv):
            raise TypeError(f"ShopExpert needs a ShopEnv, got {type(env).__name__}")
        self.env = env
        self.searches = 0

    def next_action(self) -> str:
        env, goal = self.env, self.env.goal_spec
        if env.page == "search":
            self.searches += 1
            if self.searches == 1 and env.numbered_actions:
                return env.listed_actions()[0]  # the instruction as the query: the one listed
            if self.searches == 1:
                return f"search[{' '.join(goal.attributes)} {CATEGORIES[goal.category][0]}]"
            return f"search[{env.by_asin[goal.asin].title}]"
        if env.page in ("description", "features"):
            return f"click[{PREV}]"
        if env.page == "results":
            for product in env.page_results():
                if fully_satisfies(goal, product):
                    return f"click[{product.asin}]"
            if env.page_no < min(env.num_pages, self.max_pages):
                return f"click[{NEXT}]"
            return f"click[{BACK}]"
        if not fully_satisfies(goal, env.product):
            return f"click[{PREV}]"
        for kind, value in goal.options.items():
            if env.selected.get(kind) != value:
                return f"click[{value}]"
        return f"click[{BUY}]"

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return f"<answer>{self.env.answer_for(self.next_action())}</answer>"


def _search_with_instruction(env: TextEnv, info: dict[str, Any]) -> str | None:
    return f"search[{env.goal}]" if getattr(env, "has_search_bar", False) else None


def shop_random_agent(seed: int = 0) -> RandomAgent:
    return RandomAgent(seed=seed, free_text_action=_search_with_instruction)
