"""TextWorld envs: generation and caching, determinism, expert vs random, text cleaning, errors."""

import os

import pytest

pytest.importorskip("textworld")

from crl_jax.envs import registry  # noqa: E402
from crl_jax.envs.random_agent import play_episode  # noqa: E402
from crl_jax.envs.textworld_agents import TextWorldExpert, textworld_random_agent  # noqa: E402
from crl_jax.envs.textworld_env import TextWorldEnv, clean_output  # noqa: E402

SEEDS = (0, 1)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("textworld_cache"))


@pytest.mark.parametrize("name", ["textworld/cooking", "textworld/treasure-hunter"])
def test_expert_wins_random_does_not_and_replays_identically(name, cache_dir):
    env = registry.make(name, cache_dir=cache_dir)
    assert env.name == name
    expert_runs = [play_episode(env, TextWorldExpert(), seed) for seed in SEEDS]
    for run in expert_runs:
        assert run["success"] and run["invalid_actions"] == 0, run["observations"][-2:]
    random_wins = sum(play_episode(env, textworld_random_agent(0), seed)["success"] for seed in SEEDS)
    assert random_wins < len(SEEDS)
    # Same seed, same observations: from the cached game and from a fresh env instance.
    replay = play_episode(registry.make(name, cache_dir=cache_dir), TextWorldExpert(), SEEDS[0])
    assert replay["observations"] == expert_runs[0]["observations"]
    first = expert_runs[0]["observations"][0]
    assert "$$" not in first and "Available actions:" in first
    env.close()


def test_games_are_cached_and_regenerate_identically(cache_dir, tmp_path):
    env = TextWorldEnv("treasure_hunter", cache_dir=cache_dir)
    path = env.ensure_game(SEEDS[0])
    stamp = os.path.getmtime(path)
    assert env.ensure_game(SEEDS[0]) == path and os.path.getmtime(path) == stamp
    assert not [f for f in os.listdir(cache_dir) if f.startswith(".gen-")]
    # Another cache folder regenerates the same game from the seed.
    fresh = TextWorldEnv("treasure_hunter", cache_dir=str(tmp_path))
    assert (play_episode(fresh, TextWorldExpert(), SEEDS[0])["observations"]
            == play_episode(env, TextWorldExpert(), SEEDS[0])["observations"])
    # Different settings are a different game file.
    harder = TextWorldEnv("treasure_hunter", settings={"level": 14}, cache_dir=cache_dir)
    assert harder.game_path(SEEDS[0]) != path


def test_invalid_actions_and_goal(cache_dir):
    env = TextWorldEnv("treasure_hunter", cache_dir=cache_dir, max_turns=3)
    observation, info = env.reset(SEEDS[1])
    assert info["goal"] and info["goal"] in observation
    obs, reward, terminated, truncated, info = env.step("<answer>fly to the moon</answer>")
    assert obs.startswith("Invalid action") and info["invalid_actions"] == 1 and reward == 0.0
    # Admissible commands may keep the game's capitals; matching ignores case both ways.
    for command in env.valid_actions():
        assert env.parse_action(f"<answer>{command.swapcase()}</answer>") == command
    assert "Available actions:" in obs  # the invalid-action message repeats the choices
    obs, *_, info = env.step("<answer>LOOK</answer>")
    assert info["valid_action"] and info["action"] == "look" and obs.startswith("-=")
    *_, truncated, info = env.step("no tags at all")
    assert truncated and not info["success"] and info["invalid_actions"] == 2
    env.close()


def test_clean_output_and_bad_challenge():
    raw = ("\n   ________  $$$$$$$$\\  $$ \n  | $$   $$   \n\nWelcome!\n\n-= Kitchen =-\nA kitchen."
           "\n\n\n\n>  -= Kitchen =-0/1\n")
    assert clean_output(raw) == "Welcome!\n\n-= Kitchen =-\nA kitchen."
    assert clean_output("You eat it.\n\n*** The End ***\nYou scored 1 out of 1") == "You eat it."
    with pytest.raises(ValueError, match="unknown challenge"):
        TextWorldEnv("coin_collector")
