"""The shop env: catalogue and goals, reward formula, search, pages, expert vs random, invalid actions."""

import pytest

from crl_jax.envs import registry
from crl_jax.envs.random_agent import play_episode
from crl_jax.envs.shop import ShopEnv
from crl_jax.envs.shop_agents import ShopExpert, shop_random_agent
from crl_jax.envs.shop_catalog import (Goal, Product, build_catalog, fully_satisfies, make_goal,
                                       score_purchase, search_index)


def test_catalog_is_deterministic_and_well_formed():
    catalog = build_catalog(0, 1000)
    build_catalog.cache_clear()
    again = build_catalog(0, 1000)
    assert catalog == again and catalog is not again
    assert len(catalog) == 1000 and len({p.asin for p in catalog}) == 1000
    assert build_catalog(1, 1000) != catalog
    for product in catalog[:50]:
        values = [v for vals in product.options.values() for v in vals]
        assert len(values) == len(set(values))  # one click names one option value


def test_goals_are_satisfied_by_their_product():
    catalog = build_catalog(0, 1000)
    by_asin = {p.asin: p for p in catalog}
    for seed in range(300):
        goal = make_goal(catalog, seed)
        assert fully_satisfies(goal, by_asin[goal.asin])
        assert goal.max_price >= by_asin[goal.asin].price
        assert f"price lower than {goal.max_price:.2f} dollars" in goal.instruction


def test_reward_formula_by_hand():
    product = Product("b0test0001", "shoes", "T", ("waterproof", "breathable"),
                      {"color": ("black", "red"), "size": ("9", "10")}, 50.0, "")
    goal = Goal("", "shoes", ("waterproof", "lightweight"), {"color": "black", "size": "10"}, 60.0, "x")
    # 1 of 2 attributes, 1 of 2 options, price ok: (1 + 1 + 1) / (2 + 2 + 1).
    assert score_purchase(goal, product, {"color": "black", "size": "9"}) == pytest.approx(0.6)
    assert score_purchase(goal, product, {}) == pytest.approx(0.4)
    exact = Goal("", "shoes", ("waterproof",), {"color": "red"}, 50.0, "x")
    assert score_purchase(exact, product, {"color": "red", "size": "9"}) == pytest.approx(1.0)
    wrong_type = Goal("", "coffee", ("waterproof",), {"color": "red"}, 50.0, "x")
    assert score_purchase(wrong_type, product, {"color": "red"}) == pytest.approx(0.1)
    too_dear = Goal("", "shoes", ("waterproof",), {"color": "red"}, 49.0, "x")
    assert score_purchase(too_dear, product, {"color": "red"}) == pytest.approx(2 / 3)


def test_search_ranks_exact_title_first():
    catalog = build_catalog(0, 1000)
    index = search_index(0, 1000)
    for product in catalog[:40]:
        assert index.search(product.title)[0].asin == product.asin
    assert index.search("zzzz qqqq") == []


def test_registry_expert_and_random():
    env = registry.make("shop/v1")
    assert isinstance(env, ShopEnv)
    seeds = range(40)
    expert = [play_episode(env, ShopExpert(), s) for s in seeds]
    random = [play_episode(env, shop_random_agent(0), s) for s in seeds]
    assert all(r["success"] and r["invalid_actions"] == 0 for r in expert)
    assert max(r["turns"] for r in expert) <= 10
    assert sum(r["success"] for r in random) <= 0.2 * len(seeds)


def test_same_seed_same_observation_sequence():
    for factory in (ShopExpert, lambda: shop_random_agent(5)):
        assert (play_episode(ShopEnv(), factory(), 7)["observations"]
                == play_episode(ShopEnv(), factory(), 7)["observations"])
    assert ShopEnv().reset(1)[1]["goal"] != ShopEnv().reset(2)[1]["goal"]


def test_pages_options_and_partial_reward():
    env = ShopEnv(list_actions=False)
    obs, info = env.reset(3)
    assert obs.endswith("[Search]") and env.valid_actions() == []
    target = env.by_asin[env.goal_spec.asin]
    obs, *_ = env.step(f"<answer>search[{target.title}]</answer>")
    assert f"[{target.asin.upper()}]" in obs and "Page 1 of" in obs
    if env.num_pages > 1:
        env.step("<answer>click[Next >]</answer>")
        assert env.page_no == 2
        env.step("<answer>click[< Prev]</answer>")
        assert env.page_no == 1
    obs, *_ = env.step(f"<answer>click[{target.asin.upper()}]</answer>")
    assert target.title in obs and "[Buy Now]" in obs
    env.step("<answer>click[description]</answer>")
    assert env.page == "description"
    env.step("<answer>click[< prev]</answer>")
    assert env.page == "item"
    # Buying without choosing the options earns only the attribute and price share.
    obs, reward, terminated, truncated, info = env.step("<answer>click[buy now]</answer>")
    expected = (len(env.goal_spec.attributes) + 1) / (len(env.goal_spec.attributes)
                                                      + len(env.goal_spec.options) + 1)
    assert terminated and reward == pytest.approx(expected) and not info["success"]
    assert f"{expected:.2f}" in obs


def test_invalid_actions_are_counted_not_executed():
    env = ShopEnv()
    env.reset(0)
    for text in ("search for shoes", "<answer>click[buy now]</answer>", "<answer>buy[it]</answer>",
                 "<answer>search[]</answer>"):
        obs, *_, info = env.step(text)
        assert obs.startswith("Invalid action") and env.page == "search"
    assert info["invalid_actions"] == 4
    env.step("<answer>search[shoes]</answer>")
    obs, *_, info = env.step("<answer>search[coffee]</answer>")  # no search box on result pages
    assert obs.startswith("Invalid action") and env.page == "results" and info["invalid_actions"] == 5
    with pytest.raises(ValueError, match="must be >= 1"):
        ShopEnv(max_turns=0)
