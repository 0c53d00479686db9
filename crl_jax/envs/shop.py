"""The in-repo shop environment ("shop/v1"): an offline, pure-Python WebShop analogue.

Owns the page machine of an episode: search page -> result pages -> item page (options,
description, features) -> buy. Actions are WebShop's: `search[<query>]` while the search box is
shown, and `click[<label>]` on any bracketed label of the current page (a product id, an option
value, `next >`, `< prev`, `back to search`, `description`, `features`, `buy now`). `choose[...]`
is accepted as a synonym of click for option values. Buying ends the episode with WebShop's partial
reward (see `shop_catalog.score_purchase`); success means reward 1.

`valid_actions()` lists the click actions of the current page; free-text search is allowed whenever
`has_search_bar` is true and is checked by `is_valid_action`. "shop/v1-numbered" numbers the listed
actions (see `envs.base`); its search page lists one search, with the customer's instruction as
the keywords (the query WebShop's own random agent uses), so every step can be a choice.
"""

from __future__ import annotations

import re

from crl_jax.envs.base import TextEnv
from crl_jax.envs.shop_catalog import (BRANDS, CATEGORIES, Goal, Product, build_catalog, make_goal,
                                       score_purchase, search_index)

ACTION_PATTERN = re.compile(r"^(search|click|choose)\s*\[\s*(.+?)\s*\]$", re.DOTALL)
BACK, NEXT, PREV, BUY = "back to search", "next >", "< prev", "buy now"

SYSTEM_PROMPT = """You are shopping on a web store for the customer instruction shown on every page.
Actions:
  search[<keywords>]   search the catalogue (only on the search page)
  click[<label>]       click any label shown in [brackets] on the page: a product id such as \
[B0ABC12345], an option value such as [black] or [10], [Next >], [< Prev], [Back to Search], \
[Description], [Features], [Buy Now]
On a product page, click one value for every option the instruction asks for before [Buy Now]. \
Buying ends the episode; you are scored on how well the product, its selected options and its price \
match the instruction (full marks only for an exact match).
Think briefly, then reply with exactly one action inside <answer>...</answer>, e.g. \
<answer>search[waterproof running shoes]</answer> or <answer>click[buy now]</answer>."""


class ShopEnv(TextEnv):
    """WebShop-like shopping over a generated catalogue; deterministic per seed."""

    name = "shop/v1"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, catalog_seed: int = 0, catalog_size: int = 1000, max_turns: int = 15,
                 results_per_page: int = 10, max_results: int = 50, list_actions: bool = True,
                 numbered_actions: bool = False):
        super().__init__(numbered_actions=numbered_actions)
        self.name = "shop/v1-numbered" if numbered_actions else "shop/v1"
        if catalog_size < 1 or max_turns < 1 or results_per_page < 1 or max_results < 1:
            raise ValueError("shop: catalog_size, max_turns, results_per_page and max_results must "
                             f"be >= 1, got {catalog_size}, {max_turns}, {results_per_page}, {max_results}")
        self.catalog = build_catalog(catalog_seed, catalog_size)
        self.index = search_index(catalog_seed, catalog_size)
        self.by_asin = {p.asin: p for p in self.catalog}
        self.max_turns = max_turns
        self.results_per_page = results_per_page
        self.max_results = max_results
        # As in WebShop agent setups, each page ends with the actions available on it.
        self.list_actions = list_actions
        self.goal_spec: Goal | None = None

    def vocabulary_texts(self) -> list[str]:
        # Titles capitalise brands and attributes; instructions and descriptions keep them lower case.
        words = [*BRANDS]
        for category, (noun, attributes, options, _) in CATEGORIES.items():
            values = [v for option_values in options.values() for v in option_values]
            words += [category, noun, *attributes, *options, *values]
        return [" ".join(words), " ".join(w.title() for w in words)]

    # ---- episode state -------------------------------------------------------------------------
    def _reset(self, seed: int):
        self.goal_spec = make_goal(self.catalog, seed)
        self.page = "search"
        self.results: list[Product] = []
        self.page_no = 1
        self.product: Product | None = None
        self.selected: dict[str, str] = {}
        return self._render(), self.goal_spec.instruction, {}

    @property
    def has_search_bar(self) -> bool:
        return self.page == "search"

    @property
    def num_pages(self) -> int:
        return max(1, -(-len(self.results) // self.results_per_page))

    def page_results(self) -> list[Product]:
        start = (self.page_no - 1) * self.results_per_page
        return self.results[start:start + self.results_per_page]

    def clickables(self) -> list[str]:
        if self.page == "search":
            return []
        if self.page == "results":
            labels = [BACK] + ([PREV] if self.page_no > 1 else []) + (
                [NEXT] if self.page_no < self.num_pages else [])
            return labels + [p.asin for p in self.page_results()]
        if self.page == "item":
            values = [v for vals in self.product.options.values() for v in vals]
            return [BACK, PREV] + values + ["description", "features", BUY]
        return [BACK, PREV]  # description / features pages

    def valid_actions(self) -> list[str]:
        return [f"click[{label}]" for label in self.clickables()]

    def listed_actions(self) -> list[str]:
        if not self.has_search_bar:
            return self.valid_actions()
        # A search is free text; numbered, the page offers the instruction itself as the query.
        return [f"search[{self.goal_spec.instruction}]" if self.numbered_actions else "search[<keywords>]"]

    def canonical(self, action: str) -> str | None:
        match = ACTION_PATTERN.match(" ".join(action.split()))
        if match is None:
            return None
        verb, arg = match.group(1).lower(), match.group(2)
        if verb == "search":
            return f"search[{arg}]" if self.has_search_bar and arg.strip() else None
        label = arg.lower()
        return f"click[{label}]" if label in self.clickables() else None

    def is_valid_action(self, action: str) -> bool:
        return self.goal_spec is not None and self.canonical(action) is not None

    @property
    def invalid_action_message(self) -> str:
        # Shows the current page again: the invalid turn replaced the observation that held it.
        return ("Invalid action. Reply with one action inside <answer>...</answer>: search[...] on "
                "the search page, or click[...] on a label shown in [brackets] on this page.\n"
                + self._render())

    # ---- pages ---------------------------------------------------------------------------------
    def _render(self) -> str:
        page = self._render_page()
        if not self.list_actions:
            return page
        return page + "\n" + self.action_listing()

    def _render_page(self) -> str:
        head = f"Instruction: {self.goal_spec.instruction}\n"
        if self.page == "search":
            return head + "[Search]"
        if self.page == "results":
            nav = " ".join("[< Prev]" if label == PREV else "[Next >]"
                           for label in self.clickables() if label in (PREV, NEXT))
            lines = [f"[{p.asin.upper()}]\n{p.title}\n${p.price:.2f}" for p in self.page_results()]
            body = "\n".join(lines) if lines else "No products match your search."
            return (head + f"[Back to Search]\nPage {self.page_no} of {self.num_pages} "
                    f"(Total results: {len(self.results)})\n{nav}\n{body}")
        p = self.product
        if self.page == "item":
            options = "\n".join(f"{kind}: " + " ".join(f"[{v}]" for v in values)
                                for kind, values in p.options.items())
            chosen = ", ".join(f"{k}: {v}" for k, v in self.selected.items()) or "none"
            return (head + f"[Back to Search]\n[< Prev]\n{options}\nSelected options: {chosen}\n"
                    f"{p.title}\nPrice: ${p.price:.2f}\nRating: N.A.\n[Description]\n[Features]\n[Buy Now]")
        text = p.description if self.page == "description" else "\n".join(f"- {a}" for a in p.attributes)
        return head + f"[Back to Search]\n[< Prev]\n{text}"

    def _step(self, action: str):
        verb, arg = action[:-1].split("[", 1)
        if verb == "search":
            self.results = self.index.search(arg, limit=self.max_results)
            self.page, self.page_no = "results", 1
        elif arg == BACK:
            self.page, self.results, self.product, self.selected = "search", [], None, {}
        elif arg == NEXT:
            self.page_no += 1
        elif arg == PREV:
            if self.page == "results":
                self.page_no -= 1
            elif self.page == "item":
                self.page, self.product, self.selected = "results", None, {}
            else:
                self.page = "item"
        elif self.page == "results":
            self.product, self.selected, self.page = self.by_asin[arg], {}, "item"
        elif arg in ("description", "features"):
            self.page = arg
        elif arg == BUY:
            reward = score_purchase(self.goal_spec, self.product, self.selected)
            success = reward >= 1.0 - 1e-9
            observation = ("Thank you for shopping with us! Your score (min 0.0, max 1.0): "
                           f"{reward:.2f}")
            return observation, reward, success, True, {"purchased": self.product.asin,
                                                         "selected": dict(self.selected)}
        else:  # an option value of the item page
            kind = next(k for k, values in self.product.options.items() if arg in values)
            self.selected[kind] = arg
        return self._render(), 0.0, False, False, {}
