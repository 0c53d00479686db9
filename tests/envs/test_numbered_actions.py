"""Numbered actions (envs.base): listing, answers by number, and scripted agents in that mode."""

import re

import numpy as np
import pytest

from crl_jax import envs
from crl_jax.envs.experts import expert_for, random_agent_for
from crl_jax.envs.random_agent import play_episode
from crl_jax.warm_start import demos

NUMBERED = ["shop/v1-numbered", "household/v1-numbered"]


def listed(observation: str) -> list[str]:
    """The actions of an observation's numbered "Available actions" line, checking the numbering."""
    line = observation.rsplit("\nAvailable actions: ", 1)[1]
    parts = re.split(r"(?:^|, )\((\d+)\) ", line)[1:]
    numbers, actions = parts[0::2], parts[1::2]
    assert numbers == [str(i) for i in range(1, len(actions) + 1)]
    return actions


@pytest.mark.parametrize("name", NUMBERED)
def test_listing_numbers_the_actions_the_env_accepts(name):
    env = envs.make(name)
    assert env.name == name
    observation, _ = env.reset(5)
    actions = listed(observation)
    assert actions == env.listed_actions()
    assert all(env.is_valid_action(a) for a in actions)


@pytest.mark.parametrize("name", NUMBERED)
def test_a_number_is_the_listed_action(name):
    env, twin = envs.make(name), envs.make(name)
    observation, _ = env.reset(7)
    twin.reset(7)
    actions = listed(observation)
    k = len(actions) // 2 + 1
    by_number = env.step(f"<answer>{k}</answer>")
    by_text = twin.step(f"<answer>{actions[k - 1]}</answer>")
    assert by_number[4]["action"] == by_text[4]["action"] is not None
    assert by_number[0] == by_text[0]


@pytest.mark.parametrize("name", NUMBERED)
@pytest.mark.parametrize("answer", ["0", "999", "-1", "2.5", "\u00b2", "1" * 40])
def test_numbers_outside_the_list_are_invalid(name, answer):
    env = envs.make(name)
    env.reset(3)
    observation, _, _, _, info = env.step(f"<answer>{answer}</answer>")
    assert info["action"] is None and info["invalid_actions"] == 1
    assert "Available actions: (1) " in observation  # the message shows the choices again


@pytest.mark.parametrize("name", ["shop/v1", "household/v1"])
def test_unnumbered_envs_do_not_read_numbers(name):
    env = envs.make(name)
    observation, _ = env.reset(3)
    assert "(1)" not in observation.rsplit("Available actions:", 1)[1]
    assert env.step("<answer>1</answer>")[4]["action"] is None


def test_shop_lists_the_instruction_as_the_search():
    env = envs.make("shop/v1-numbered")
    observation, info = env.reset(11)
    assert observation.endswith(f"Available actions: (1) search[{info['goal']}]")
    plain = envs.make("shop/v1")
    assert plain.reset(11)[0].endswith("Available actions: search[<keywords>]")


@pytest.mark.parametrize("name", NUMBERED)
def test_scripted_agents_answer_with_numbers_and_the_expert_still_solves(name):
    env = envs.make(name, max_turns=8)
    results = [play_episode(env, expert_for(env), seed) for seed in range(20)]
    assert np.mean([r["success"] for r in results]) >= 0.95
    assert all(r["invalid_actions"] == 0 for r in results)
    for agent in (expert_for(env), random_agent_for(env, seed=1)):
        observation, info = env.reset(2)
        agent.reset(env, observation, info)
        answer = agent.act(observation, info)
        assert re.fullmatch(r"<answer>\d+</answer>", answer), answer


def test_demos_record_the_actions_taken_not_the_numbers():
    env = envs.make("household/v1-numbered", max_turns=8)
    demo = demos.play_demo(env, env.name, 4, 0.0, np.random.default_rng(0), max_turns=8, entry=None,
                           tools=False, search=False)
    answers = [m["content"] for m in demo.messages if m["role"] == "assistant"]
    assert len(demo.actions) == len(answers) == demo.facts.actions
    assert all(re.fullmatch(r"<answer>\d+</answer>", a) for a in answers)
    assert demo.actions[0].startswith("go to ") and demo.facts.success
