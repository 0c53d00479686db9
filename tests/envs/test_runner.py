"""Batched runner: completes batches whose envs raise or hang, records every failure, stays fast."""

import time

import pytest

from crl_jax.envs import make
from crl_jax.envs.experts import expert_for, random_agent_for
from crl_jax.envs.faults import FaultyEnv, InjectedFault
from crl_jax.envs.runner import run_batch


def _sokoban(n):
    return [make("sokoban/6x6-2box") for _ in range(n)]


def test_clean_batch_matches_serial_play():
    envs = _sokoban(4)
    records = run_batch(envs, [0, 1, 2, 3], agents=[expert_for(e) for e in envs], step_timeout_s=5)
    assert [r.seed for r in records] == [0, 1, 2, 3]
    assert all(r.success and r.reason == "success" for r in records)
    for r in records:
        assert r.transcript[0]["action"] is None and len(r.transcript) == r.turns + 1
        assert r.total_reward == 1.0 and r.goal.startswith("Push all")
    # The same episode played directly gives the same observations.
    env, agent = make("sokoban/6x6-2box"), None
    agent = expert_for(env)
    obs, info = env.reset(2)
    agent.reset(env, obs, info)
    seen = [obs]
    for step in records[2].transcript[1:]:
        action = agent.act(obs, info)
        assert action == step["action"]
        obs, *_, info = env.step(action)
        seen.append(obs)
    assert seen == [s["observation"] for s in records[2].transcript]


def test_raising_env_ends_only_its_own_episode():
    # 10% of steps raise; half the batch is healthy and must finish normally.
    faulty = [FaultyEnv(e, raise_prob=0.1, seed=i) for i, e in enumerate(_sokoban(8))]
    healthy = _sokoban(4)
    envs = faulty + healthy
    agents = [random_agent_for(e, seed=0) for e in envs]
    records = run_batch(envs, list(range(12)), agents=agents, step_timeout_s=5)
    assert len(records) == 12
    for env, rec in zip(faulty, records[:8]):
        if "raise" in env.faults:
            assert rec.reason.startswith("error: InjectedFault") and not rec.success
            assert rec.failed_by_fault
        else:
            assert rec.reason in ("success", "truncated")
    assert sum("raise" in e.faults for e in faulty) >= 3, "with 10% faults most episodes hit one"
    assert all(r.reason in ("success", "truncated") for r in records[8:])
    assert all(r.turns == 30 or r.success for r in records[8:])
    assert issubclass(InjectedFault, RuntimeError)


def test_hanging_env_times_out_without_blocking_the_batch():
    hanging = [FaultyEnv(e, hang_prob=1.0, hang_s=3.0, seed=i) for i, e in enumerate(_sokoban(2))]
    healthy = _sokoban(3)
    envs = hanging + healthy
    start = time.monotonic()
    records = run_batch(envs, [0, 1, 2, 3, 4], agents=[expert_for(e) for e in envs],
                        step_timeout_s=0.25)
    elapsed = time.monotonic() - start
    assert elapsed < 2.5, f"a hung env blocked the batch for {elapsed:.1f}s"
    for rec in records[:2]:
        assert rec.reason == "timeout: step > 0.25s" and not rec.success and rec.turns == 1
    assert all(r.success for r in records[2:])


def test_batched_policy_and_argument_errors():
    envs = _sokoban(3)
    calls = []

    def policy(observations, infos):
        calls.append(len(observations))
        return ["<answer>left</answer>"] * len(observations)

    records = run_batch(envs, [0, 1, 2], policy=policy, step_timeout_s=5)
    assert all(r.turns == envs[0].max_turns or r.success for r in records)
    assert calls[0] == 3 and all(c <= 3 for c in calls)
    with pytest.raises(ValueError, match="exactly one"):
        run_batch(envs, [0, 1, 2])
    with pytest.raises(ValueError, match="seeds"):
        run_batch(envs, [0], policy=policy)


def test_failing_reset_and_agent_are_recorded():
    class BrokenReset:
        name = "broken"

        def reset(self, seed):
            raise OSError("simulator did not start")

    class BrokenAgent:
        def reset(self, env, observation, info):
            pass

        def act(self, observation, info):
            raise ValueError("model produced nothing")

    good = make("sokoban/6x6-2box")
    envs = [BrokenReset(), make("sokoban/6x6-2box"), good]
    agents = [expert_for(good), BrokenAgent(), expert_for(good)]
    records = run_batch(envs, [0, 1, 2], agents=agents, step_timeout_s=5)
    assert records[0].reason == "error: OSError: simulator did not start"
    assert records[1].reason == "agent error: ValueError: model produced nothing"
    assert records[2].success
