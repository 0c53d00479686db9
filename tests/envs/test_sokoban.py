"""Sokoban 6x6/2 boxes: generated levels are solvable, rules, determinism, expert vs random."""

import pytest

from crl_jax.envs import make
from crl_jax.envs.experts import expert_for, random_agent_for
from crl_jax.envs.sokoban import MOVES, generate_level, solve_level


def _play(env, agent, seed):
    observation, info = env.reset(seed)
    agent.reset(env, observation, info)
    observations, done = [observation], False
    while not done:
        observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
        observations.append(observation)
        done = terminated or truncated
    return observations, info


def _replay(level, moves):
    """Apply moves with an independent implementation of the push rule; return final boxes."""
    walls, targets, boxes, player = level
    boxes = set(boxes)
    for word in moves:
        dx, dy = MOVES[word]
        ahead = (player[0] + dx, player[1] + dy)
        if ahead in walls:
            continue
        if ahead in boxes:
            beyond = (ahead[0] + dx, ahead[1] + dy)
            if beyond in walls or beyond in boxes:
                continue
            boxes = (boxes - {ahead}) | {beyond}
        player = ahead
    return boxes


@pytest.mark.parametrize("seed", range(0, 60))
def test_generated_levels_are_solvable_and_unsolved_at_start(seed):
    level = generate_level(seed)
    walls, targets, boxes, player = level
    assert len(boxes) == 2 and len(targets) == 2
    assert not (set(boxes) & set(targets)), "a level must not start solved"
    assert player not in walls and player not in boxes and not (set(boxes) & set(walls))
    moves = solve_level(*level)
    assert moves is not None, f"seed {seed}: generated level has no solution"
    assert _replay(level, moves) == set(targets)


def test_generation_is_deterministic_and_varied():
    assert generate_level(3) == generate_level(3)
    assert len({generate_level(s) for s in range(20)}) == 20


def test_rules_and_rendering():
    env = make("sokoban/6x6-2box")
    observation, info = env.reset(0)
    rows = observation.splitlines()
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    assert sum(r.count("X") for r in rows) == 2 and sum(r.count("P") + r.count("S") for r in rows) == 1
    assert set(env.valid_actions()) == {"up", "down", "left", "right"}
    # Walk into the wall until bumping: the player stays, the message says why.
    for _ in range(6):
        observation, *_ = env.step("<answer>up</answer>")
    assert "wall" in observation or "box" in observation
    _, _, _, _, info = env.step("<answer>jump</answer>")
    assert info["invalid_actions"] == 1


def test_same_seed_same_observation_sequence():
    env = make("sokoban/6x6-2box")
    a, _ = _play(env, random_agent_for(env, seed=1), 5)
    b, _ = _play(env, random_agent_for(env, seed=1), 5)
    assert a == b


def test_expert_solves_and_random_is_worse():
    env = make("sokoban/6x6-2box")
    expert_wins = sum(_play(env, expert_for(env), s)[1]["success"] for s in range(30))
    random_wins = sum(_play(env, random_agent_for(env, seed=0), s)[1]["success"] for s in range(30))
    assert expert_wins == 30
    assert random_wins < 15
