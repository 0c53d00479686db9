"""Catalogue, goals, search and reward of the in-repo shop environment (an offline WebShop analogue).

Owns: the category tables, `build_catalog(seed, size)` (deterministic products with attributes,
options and prices), `make_goal(catalog, seed)` (a WebShop-style instruction derived from one
product), `SearchIndex` (tf-idf ranking over titles, attributes and categories) and `score_purchase`
(WebShop's attribute/option/price reward).

Reward of buying product y with selected options for goal u (WebShop's formula, type factor
simplified to category equality):
    r = (|u.attrs ∩ y.attrs| + |u.options ∩ selected| + [y.price <= u.max_price])
        / (|u.attrs| + |u.options| + 1) * (1.0 if same category else 0.1)
Success is r == 1.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import re
from collections import Counter, defaultdict

# category -> (noun, attributes, options {type: values}, price range)
CATEGORIES: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[str, ...]], tuple[int, int]]] = {
    "shoes": ("running shoes", ("non-slip", "lightweight", "breathable", "waterproof", "memory foam",
                                "arch support", "rubber sole", "wide width"),
              {"color": ("black", "white", "grey", "navy", "red", "blue"),
               "size": ("6", "7", "8", "9", "10", "11", "12")}, (25, 140)),
    "t-shirt": ("t-shirt", ("cotton", "slim fit", "short sleeve", "long sleeve", "moisture wicking",
                            "machine wash", "crew neck", "v-neck"),
                {"color": ("black", "white", "green", "yellow", "navy", "pink"),
                 "size": ("small", "medium", "large", "x-large", "xx-large")}, (8, 40)),
    "headphones": ("headphones", ("wireless", "noise cancelling", "bluetooth", "long battery life",
                                  "foldable", "built-in microphone", "over-ear", "water resistant"),
                   {"color": ("black", "white", "silver", "blue", "rose gold")}, (15, 300)),
    "coffee": ("coffee", ("organic", "decaf", "dark roast", "medium roast", "fair trade", "whole bean",
                          "ground", "single origin"),
               {"size": ("12 ounce", "2 pound", "32 ounce", "5 pound"),
                "flavor": ("original", "hazelnut", "vanilla", "caramel", "mocha")}, (7, 60)),
    "shampoo": ("shampoo", ("sulfate free", "paraben free", "natural ingredients", "for dry hair",
                            "for curly hair", "cruelty free", "anti-dandruff", "color safe"),
                {"size": ("8.5 fl oz", "16 fl oz", "33.8 fl oz"),
                 "scent": ("coconut", "argan oil", "tea tree", "lavender", "unscented")}, (5, 45)),
    "backpack": ("backpack", ("water resistant", "laptop compartment", "usb charging port",
                              "anti-theft", "lightweight", "large capacity", "padded straps"),
                 {"color": ("black", "grey", "navy", "olive", "burgundy")}, (18, 120)),
    "phone case": ("phone case", ("shockproof", "slim fit", "wireless charging compatible",
                                  "kickstand", "clear", "for iphone 13", "for galaxy s21",
                                  "screen protector included"),
                   {"color": ("black", "clear", "blue", "purple", "green", "pink")}, (6, 35)),
    "candles": ("scented candles", ("soy wax", "long lasting", "gift set", "lead-free wick",
                                    "natural", "glass jar", "3-wick"),
                {"scent": ("lavender", "vanilla", "sandalwood", "eucalyptus", "fresh linen"),
                 "size": ("single", "set of 2", "set of 4")}, (9, 55)),
    "snack bars": ("snack bars", ("gluten free", "high protein", "low sugar", "keto friendly",
                                  "vegan", "non-gmo", "individually wrapped"),
                   {"flavor": ("chocolate", "peanut butter", "almond", "berry", "cookie dough"),
                    "pack": ("pack of 6", "pack of 12", "pack of 24")}, (8, 48)),
    "desk lamp": ("desk lamp", ("dimmable", "led", "usb charging port", "touch control", "eye-caring",
                                "adjustable arm", "clamp mount", "memory function"),
                  {"color": ("black", "white", "silver", "wood grain")}, (14, 90)),
}
BRANDS = ("acorn", "bluepeak", "corvo", "delmar", "everly", "fenwick", "galvo", "hartwell", "ionix",
          "juniper", "kestrel", "lumen", "marlow", "northby", "orrin", "pellham", "quorra", "ridgely",
          "solano", "tamsin", "ulric", "vantage", "wexley", "yardley", "zentra")
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def tokenize(text: str) -> list[str]:
    # A crude plural strip so "shoes"/"shoe" and "bars"/"bar" match, as a shop search would.
    return [t[:-1] if len(t) > 3 and t.endswith("s") and not t.endswith("ss") else t
            for t in _TOKEN.findall(text.lower())]


@dataclasses.dataclass(frozen=True)
class Product:
    asin: str  # lower case, as the agent clicks it
    category: str
    title: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: float
    description: str


@dataclasses.dataclass(frozen=True)
class Goal:
    instruction: str
    category: str
    attributes: tuple[str, ...]
    options: dict[str, str]  # option type -> wanted value
    max_price: float
    asin: str  # the product the goal was derived from (privileged)


@functools.lru_cache(maxsize=4)
def build_catalog(seed: int = 0, size: int = 1000) -> tuple[Product, ...]:
    """`size` products, the same for the same (seed, size); cached because every env shares it."""
    rng = random.Random(f"shop-catalog/{seed}")
    categories = sorted(CATEGORIES)
    products, asins = [], set()
    for _ in range(size):
        category = categories[rng.randrange(len(categories))]
        noun, attrs, options, (lo, hi) = CATEGORIES[category]
        while (asin := "b0" + "".join(rng.choices("abcdefghjkmnpqrstuvwxyz0123456789", k=8))) in asins:
            pass
        asins.add(asin)
        chosen = tuple(rng.sample(attrs, k=rng.randint(2, 4)))
        brand = rng.choice(BRANDS)
        in_title = chosen[:rng.randint(1, len(chosen))]
        features = " ".join(a.title() for a in in_title)
        title = f"{brand.title()} {features} {noun.title()} - Model {asin[-4:].upper()}"
        product_options = {kind: tuple(sorted(rng.sample(values, k=rng.randint(2, min(4, len(values))))))
                           for kind, values in options.items()}
        price = round(rng.uniform(lo, hi)) - 0.01
        description = (f"The {brand.title()} {noun} is {', '.join(chosen)}. Available in "
                       + "; ".join(f"{k}: {', '.join(v)}" for k, v in product_options.items()) + ".")
        products.append(Product(asin, category, title, chosen, product_options, price, description))
    return tuple(products)


def make_goal(catalog: tuple[Product, ...], seed: int) -> Goal:
    """A WebShop-style instruction that the product drawn for `seed` fully satisfies."""
    rng = random.Random(f"shop-goal/{seed}")
    product = catalog[rng.randrange(len(catalog))]
    noun = CATEGORIES[product.category][0]
    attributes = tuple(rng.sample(product.attributes, k=rng.randint(1, min(3, len(product.attributes)))))
    options = {kind: rng.choice(values) for kind, values in sorted(product.options.items())}
    max_price = float(math.ceil(product.price * rng.uniform(1.05, 1.6) / 10) * 10)
    phrases = [value if kind == "pack" else f"{value} {kind}" if kind in ("color", "scent", "flavor")
               else f"{kind} {value}" for kind, value in options.items()]
    opener = rng.choice(("i need", "i'm looking for", "find me", "i want to buy"))
    instruction = (f"{opener} {' and '.join(attributes)} {noun} with {' and '.join(phrases)}, "
                   f"and price lower than {max_price:.2f} dollars")
    return Goal(instruction, product.category, attributes, options, max_price, product.asin)


def score_purchase(goal: Goal, product: Product, selected: dict[str, str]) -> float:
    attr_hits = sum(a in product.attributes for a in goal.attributes)
    option_hits = sum(selected.get(kind) == value for kind, value in goal.options.items())
    price_ok = product.price <= goal.max_price
    total = len(goal.attributes) + len(goal.options) + 1
    type_factor = 1.0 if product.category == goal.category else 0.1
    return (attr_hits + option_hits + price_ok) / total * type_factor


def fully_satisfies(goal: Goal, product: Product) -> bool:
    """Whether buying `product` with the right options can earn reward 1 (privileged check)."""
    return (product.category == goal.category and product.price <= goal.max_price
            and all(a in product.attributes for a in goal.attributes)
            and all(v in product.options.get(k, ()) for k, v in goal.options.items()))


class SearchIndex:
    """tf-idf over each product's title, attributes and category noun; ties broken by catalogue order."""

    def __init__(self, catalog: tuple[Product, ...]):
        self.catalog = catalog
        self.postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for i, p in enumerate(catalog):
            # The title counts twice: what a listing is called matters most, as on a real shop.
            counts = Counter(tokenize(p.title) * 2 + tokenize(" ".join(p.attributes))
                             + tokenize(CATEGORIES[p.category][0]))
            for token, count in counts.items():
                self.postings[token].append((i, 1.0 + math.log(count)))
        self.idf = {t: math.log(1 + len(catalog) / len(post)) for t, post in self.postings.items()}

    def search(self, query: str, limit: int = 50) -> list[Product]:
        scores: dict[int, float] = defaultdict(float)
        for token in set(tokenize(query)):
            for i, weight in self.postings.get(token, ()):
                scores[i] += weight * self.idf[token]
        ranked = sorted(scores, key=lambda i: (-scores[i], i))
        return [self.catalog[i] for i in ranked[:limit]]


@functools.lru_cache(maxsize=4)
def search_index(seed: int = 0, size: int = 1000) -> SearchIndex:
    return SearchIndex(build_catalog(seed, size))
