"""Environment table: scripted-expert and random success over the test seeds, turns, env steps/s.

For every registered env whose module imports and which can be built here (optional packages or
local data may be missing: such envs are listed as skipped with the reason), plays the scripted
expert and the random agent on the first N test-split seeds and prints a markdown table.
Steps/s counts only time spent inside `env.step` (not the agents' planning).

    python benchmarks/envs.py [--seeds 100] [--envs minihack/ sokoban/] [--json out.json]

`--json -` prints the rows as one JSON line on stdout instead (after the table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from crl_jax.data.task_splits import task_seeds
from crl_jax.envs import list_envs, make
from crl_jax.envs.experts import expert_for, random_agent_for


def play(env, agent, seed: int) -> tuple[bool, int, int, float]:
    """(success, turns, steps, seconds inside env.step) for one episode."""
    observation, info = env.reset(seed)
    agent.reset(env, observation, info)
    steps, step_s, done = 0, 0.0, False
    while not done:
        action = agent.act(observation, info)
        t0 = time.perf_counter()
        observation, _, terminated, truncated, info = env.step(action)
        step_s += time.perf_counter() - t0
        steps += 1
        done = terminated or truncated
    return bool(info["success"]), int(info["turn"]), steps, step_s


def bench_env(name: str, seeds: list[int]) -> dict:
    env = make(name)
    row = {"env": name}
    total_steps, total_s = 0, 0.0
    try:
        for label in ("expert", "random"):
            wins, turns, failed = 0, 0, []
            t0 = time.perf_counter()
            for seed in seeds:
                agent = expert_for(env) if label == "expert" else random_agent_for(env, seed=0)
                ok, n, steps, step_s = play(env, agent, seed)
                wins += ok
                if not ok:
                    failed.append(seed)
                turns += n
                total_steps += steps
                total_s += step_s
            row[f"{label}_success"] = wins / len(seeds)
            row[f"{label}_turns"] = turns / len(seeds)
            row[f"{label}_wall_s"] = time.perf_counter() - t0
            if label == "expert":
                row["expert_failed_seeds"] = failed
    finally:
        env.close()
    row["steps_per_s"] = total_steps / max(total_s, 1e-9)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="test seeds per env")
    parser.add_argument("--envs", nargs="*", default=None, help="name prefixes to include")
    parser.add_argument("--json", default=None,
                        help="also write the rows to this JSON file ('-': one line on stdout)")
    args = parser.parse_args(argv)
    seeds = task_seeds("test", args.seeds)
    names = [n for n in list_envs() if not args.envs or any(n.startswith(p) for p in args.envs)]
    rows, skipped = [], []
    for name in names:
        try:
            make(name).close()
        except Exception as exc:  # noqa: BLE001 - a missing package or dataset skips the env
            skipped.append((name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"))
            continue
        row = bench_env(name, seeds)
        rows.append(row)
        print(f"done {name}: {row}", file=sys.stderr, flush=True)
    print("| env | expert success | random success | expert turns | random turns | env steps/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['expert_success']:.2f} | {r['random_success']:.2f} | "
              f"{r['expert_turns']:.1f} | {r['random_turns']:.1f} | {r['steps_per_s']:.0f} |")
    for name, why in skipped:
        print(f"| {name} | skipped: {why} | | | | |")
    print(f"\n{len(seeds)} test seeds per env (seeds {seeds[0]}..{seeds[-1]}).")
    summary = {"benchmark": "envs", "rows": rows, "skipped": skipped, "seeds": len(seeds)}
    if args.json == "-":
        print(json.dumps(summary), flush=True)
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
