"""Registry and agent lookup: names, clear errors, every importable env has an expert and a random agent."""

import pytest

from crl_jax.envs import list_envs, make
from crl_jax.envs.base import TextEnv
from crl_jax.envs.experts import expert_for, random_agent_for

PAPER_ENVS = ["minihack/room-ultimate-5x5", "minihack/mazewalk-9x9", "minihack/keyroom-dark-s5",
              "minihack/river-narrow", "sokoban/6x6-2box"]


def test_listing_holds_the_paper_envs():
    names = list_envs()
    assert names == sorted(names)
    for name in PAPER_ENVS:
        assert name in names


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="sokoban/6x6-2box"):
        make("sokoban/7x7")


def test_kwargs_override_defaults():
    env = make("sokoban/6x6-2box", max_turns=7)
    assert env.max_turns == 7 and env.name == "sokoban/6x6-2box"


# Environments the test suite registers for itself ("test/...") are fixtures, not shipped envs.
@pytest.mark.parametrize("name", [n for n in list_envs() if not n.startswith("test/")])
def test_each_buildable_env_has_expert_and_random_agent(name):
    try:
        env = make(name)
    except ImportError as exc:  # optional package or local data missing: nothing to check here
        pytest.skip(f"{name}: {exc}")
    try:
        assert isinstance(env, TextEnv) and env.name == name
        assert env.system_prompt and env.max_turns > 0
        if name.startswith("textworld/"):
            # Its first reset compiles a game (tens of seconds); its own tests play it.
            assert type(expert_for(env)).__name__ == "TextWorldExpert"
            return
        observation, info = env.reset(0)
        assert isinstance(observation, str) and observation and "goal" in info
        expert, rand = expert_for(env), random_agent_for(env, seed=0)
        for agent in (expert, rand):
            agent.reset(env, observation, info)
            action = agent.act(observation, info)
            assert env.parse_action(action) is not None, f"{name}: {action!r} does not parse"
    finally:
        env.close()


def test_expert_lookup_fails_clearly_for_foreign_envs():
    class Foreign(TextEnv):
        name = "foreign"

        def _reset(self, seed):
            return "", "", {}

        def _step(self, action):
            return "", 0.0, False, False, {}

        def valid_actions(self):
            return ["wait"]

    with pytest.raises(LookupError, match="Foreign"):
        expert_for(Foreign())
    assert random_agent_for(Foreign(), 0) is not None
