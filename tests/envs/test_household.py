"""The household env: determinism, expert vs random, command handling, mechanics, placement priors."""

from collections import Counter

import pytest

from crl_jax.envs import registry
from crl_jax.envs.household import HouseholdEnv
from crl_jax.envs.household_agents import HouseholdExpert, household_random_agent
from crl_jax.envs.household_world import FAMILIES, generate_scene, receptacle_type
from crl_jax.envs.random_agent import play_episode


def test_registry_builds_household():
    env = registry.make("household/v1")
    assert isinstance(env, HouseholdEnv) and env.max_turns == 40


def test_same_seed_same_observation_sequence():
    for agent_factory in (HouseholdExpert, lambda: household_random_agent(3)):
        first = play_episode(HouseholdEnv(), agent_factory(), 11)["observations"]
        second = play_episode(HouseholdEnv(), agent_factory(), 11)["observations"]
        assert first == second
    starts = {HouseholdEnv().reset(seed)[0] for seed in range(20)}
    assert len(starts) == 20


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_expert_solves_every_family(family):
    env = HouseholdEnv(families=[family])
    for seed in range(8):
        result = play_episode(env, HouseholdExpert(), seed)
        assert result["success"], (family, seed, result["observations"][-3:])
        assert result["invalid_actions"] == 0 and result["turns"] <= 12


def test_random_agent_much_worse_than_expert():
    env = HouseholdEnv()
    seeds = range(100, 140)
    expert = sum(play_episode(env, HouseholdExpert(), s)["success"] for s in seeds)
    random = sum(play_episode(env, household_random_agent(0), s)["success"] for s in seeds)
    assert expert == len(seeds)
    assert random <= 0.25 * len(seeds)


def test_invalid_and_impossible_commands():
    env = HouseholdEnv(max_turns=5, list_actions=False)
    env.reset(0)
    # No answer tag: invalid, counted, consumes a turn.
    obs, reward, terminated, truncated, info = env.step("I will go to the fridge")
    assert obs.startswith("Invalid action") and info["invalid_actions"] == 1 and info["turn"] == 1
    # A thing that is not in the room: invalid too.
    obs, *_, info = env.step("<answer>go to spaceship 1</answer>")
    assert obs.startswith("Invalid action") and info["invalid_actions"] == 2
    # Well-formed but impossible (not at the receptacle): ALFWorld's "Nothing happens.", not invalid.
    receptacle = env.scene.receptacles[0]
    obj = next(o for r in env.scene.receptacles for o in env.contents[r] if o != "desklamp 1")
    obs, *_, info = env.step(f"<answer>take {obj} from {receptacle}</answer>")
    assert obs == "Nothing happens." and info["invalid_actions"] == 2 and info["valid_action"]
    env.step("<answer>look</answer>")
    obs, reward, terminated, truncated, info = env.step("<answer>inventory</answer>")
    assert truncated and not terminated and reward == 0.0 and not info["success"]
    with pytest.raises(RuntimeError):
        env.step("<answer>look</answer>")


def test_closed_receptacles_hide_contents_and_heating_marks_hot():
    env = HouseholdEnv(families=["heat"], list_actions=False)
    env.reset(5)
    closed = next(r for r in env.scene.receptacles if receptacle_type(r) == "cabinet")
    obs, *_ = env.step(f"<answer>go to {closed}</answer>")
    assert obs.endswith(f"The {closed} is closed.")
    obs, *_ = env.step(f"<answer>open {closed}</answer>")
    assert obs.startswith(f"You open the {closed}. In it, you see")
    # Play the expert to the point where it holds the target, then heat it.
    expert = HouseholdExpert()
    expert.reset(env, "", {})
    while env.holding is None:
        env.step(expert.act("", {}))
    held = env.holding
    env.step("<answer>go to microwave 1</answer>")
    obs, *_ = env.step(f"<answer>heat {held} with microwave 1</answer>")
    assert obs == f"You heat the {held} using the microwave 1."
    obs, *_ = env.step(f"<answer>examine {held}</answer>")
    assert obs == f"This is a hot {held}."


def test_put_accepts_alfworld_spellings():
    env = HouseholdEnv(families=["pick_and_place"], list_actions=False)
    env.reset(2)
    expert = HouseholdExpert()
    expert.reset(env, "", {})
    while env.holding is None:
        env.step(expert.act("", {}))
    here, held = env.location, env.holding
    obs, *_ , info = env.step(f"<answer>put {held} in/on {here}</answer>")
    assert info["action"] == f"put {held} {env.preposition(here)} {here}"
    assert env.holding is None and held in env.contents[here]


def test_placement_follows_priors():
    # Mugs live mostly in cabinets or the coffee machine; eggs mostly in the fridge.
    homes = {"mug": Counter(), "egg": Counter()}
    for seed in range(400):
        scene = generate_scene(seed, ("heat", "cool"))
        for receptacle, objects in scene.contents.items():
            for obj in objects:
                if receptacle_type(obj) in homes:
                    homes[receptacle_type(obj)][receptacle_type(receptacle)] += 1
    mug_total, egg_total = sum(homes["mug"].values()), sum(homes["egg"].values())
    assert mug_total > 50 and egg_total > 30
    assert (homes["mug"]["cabinet"] + homes["mug"]["coffeemachine"]) / mug_total > 0.65
    assert homes["egg"]["fridge"] / egg_total > 0.6


def test_goal_never_already_satisfied_and_bad_arguments():
    for seed in range(200):
        env = HouseholdEnv()
        env.reset(seed)
        assert not env.solved(), seed
    with pytest.raises(ValueError, match="unknown task families"):
        HouseholdEnv(families=["juggle"])
    with pytest.raises(ValueError, match="seed"):
        HouseholdEnv().reset(-1)
