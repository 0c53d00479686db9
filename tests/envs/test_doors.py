"""The drifting-doors diagnostic: hidden facts that drift, facts in the trajectory, an agent that
only explores without advice, and a summariser that copies one fact of the episode."""

import numpy as np

from crl_jax import envs
from crl_jax.envs.doors import DOORS, HALLS, AdviceFollower, open_door
from crl_jax.warm_start import lessons


def play(env, seed, advice=None):
    observation, info = env.reset(seed)
    agent = AdviceFollower()
    agent.reset(env, observation, info)
    if advice:
        agent.advise(advice)
    done = False
    while not done:
        observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
        done = terminated or truncated
    return info


def test_each_hall_has_one_open_door_that_moves_at_every_drift():
    for hall in HALLS:
        doors = [open_door(hall, step, 6) for step in range(0, 24, 6)]
        assert all(a != b for a, b in zip(doors, doors[1:]))
        assert len({open_door(hall, step, 6) for step in range(6)}) == 1
    assert open_door("north", 0, 6) != open_door("south", 0, 6)


def test_the_observation_does_not_say_which_door_opens_and_the_trajectory_does():
    env = envs.make("diag/doors")
    env.set_training_step(7)
    observation, info = env.reset(3)
    door = open_door(env.hall, 7, 6)
    assert "opens" not in observation and set(env.valid_actions()) == set(DOORS)
    _, _, terminated, _, info = env.step(f"<answer>{door}</answer>")
    assert terminated and info["success"]
    assert info["facts"][-1] == f"In the {env.hall} hall the {door} door opens."
    assert env.current_facts(7) == [f"In the {h} hall the {open_door(h, 7, 6)} door opens." for h in HALLS]


def test_without_advice_only_exploration_with_the_current_fact_always():
    env = envs.make("diag/doors")
    env.set_training_step(13)
    alone = np.mean([play(env, seed)["success"] for seed in range(400)])
    assert 0.3 < alone < 0.5  # two guesses among five doors: 0.4
    advised = [play(env, seed, " ".join(env.current_facts(13)))["success"] for seed in range(50)]
    stale = np.mean([play(env, seed, " ".join(env.current_facts(0)))["success"] for seed in range(400)])
    assert all(advised) and stale < 0.5


def test_the_summariser_copies_one_fact_of_the_episode_not_always_the_useful_one():
    env = envs.make("diag/doors")
    picked = []
    for seed in range(60):
        info = play(env, seed)
        facts = lessons.EpisodeFacts("diag/doors", info["success"], info["turn"], 0, 2, info["facts"])
        title, content = lessons.lesson(facts)
        assert title == lessons.FACT_TITLE and content in info["facts"]
        picked.append("opens" in content)
    assert 0 < sum(picked) < len(picked)
    assert len(lessons.all_lessons("diag/doors")) == 2 * 5 * 2 + 2 * 12
