"""Measure a warm start on its own: what the cloned actor can do before any RL step.

    python experiments/warm_start_probe.py --config=multi_task.py:baseline --workdir=probe \
        --config.eval.tasks_per_env=32 --config.eval.with_experience=False \
        [--config.warm_start.window_steps=3000 ...] [--episodes=24]

Runs (or reuses, from `<workdir>/warm_start`) the config's warm start, then
  1. the run's start evaluation (`eval.*`): test success and invalid actions per task;
  2. a teacher-forced check on `--episodes` test-split episodes per task played by the scripted
     expert (no random actions, no lesson): for every expert action, the probability the actor
     gives that whole action (its tokens and end marker) in the expert's context, grouped by task
     and kind of action (its verb; `click[<id>]` when the argument is one word with a digit, such
     as a product code). Success needs every action right, so this shows which actions are learnt
     and which are not, even where success is 0.
Prints a table and, last, one JSON line with every figure. Used for the mixture notes in docs/results.md.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def action_kind(text: str) -> str:
    """The verb of an action (`go`, `click`, `north`, ...); `click[<id>]` when its bracketed argument
    is one word holding a digit (a product code)."""
    found = _ANSWER.search(text)
    action = (found.group(1) if found else text).strip()
    verb = re.split(r"[\s\[]", action, maxsplit=1)[0] or action
    argument = action[len(verb):].strip()
    if argument.startswith("[") and re.fullmatch(r"\[\S*\d\S*\]", argument):
        return f"{verb}[<id>]"
    return verb


def expert_action_probabilities(log_probs: np.ndarray, mask: np.ndarray) -> list[float]:
    """exp(sum of token log-probs) over each trained span (one action and its end marker)."""
    from crl_jax.warm_start.demos import trained_spans

    return [float(np.exp(np.sum(log_probs[a:b]))) for a, b in trained_spans(mask)]


def define_flags(flag_values) -> None:
    from absl import flags

    flags.DEFINE_string("workdir", "workdir", "where the warm start is kept", flag_values=flag_values)
    flags.DEFINE_integer("episodes", 24, "expert episodes per task for the teacher-forced check",
                         flag_values=flag_values)


def main(argv: list[str]) -> None:
    from crl_jax.config import ConfigError
    from crl_jax.run import config_loading

    try:
        cfg, flag_values = config_loading.parse_command_line(
            ["warm_start_probe.py", *argv], os.path.join(_HERE, "configs"), define_flags=define_flags)
    except ConfigError as err:
        sys.exit("\n".join(f"config error: {problem}" for problem in err.problems))
    episodes, workdir = flag_values.episodes, flag_values.workdir

    import jax

    from crl_jax import envs, trainer
    from crl_jax.rl.logprobs import sequence_logprobs
    from crl_jax.rl.sft import sft_batch
    from crl_jax.warm_start import demos

    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
    trainer.log.setLevel(logging.INFO)  # warm start and evaluation progress
    if not cfg.warm_start.enabled:
        sys.exit("error: the config has no warm start (warm_start.enabled is false)")
    os.makedirs(workdir, exist_ok=True)
    run = trainer.Trainer(cfg, workdir)
    start = run.before_rl()  # warm start, then the start evaluation if eval.at_start
    state = run.actor_state
    log_probs = jax.jit(lambda params, batch: sequence_logprobs(state.graphdef, params, batch)[0])
    by_kind: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for name in cfg.tasks:
        env = envs.make(name)
        try:
            for spec_ in [t for t in run.test_tasks if t["env"] == name][:episodes]:
                demo = demos.play_demo(env, name, int(spec_["seed"]), 0.0, np.random.default_rng(0),
                                       max_turns=cfg.rollout.max_turns, entry=None, tools=False,
                                       search=False)
                ids, mask = demos.actor_examples(run.tokenizer, [demo])[0]
                batch = sft_batch([(ids, mask)], cfg.rl.max_seq_len, 1)
                probs = expert_action_probabilities(np.asarray(log_probs(state.params, batch))[0], mask)
                # Kinds from the actions taken, not the answers' text, which may be numbers.
                for text, p in zip(demo.actions, probs):
                    by_kind[(name, action_kind(text or "invalid"))].append(p)
                    by_kind[(name, "all")].append(p)
        finally:
            env.close()
    table = {f"{task} {kind}": {"n": len(ps), "mean_p": float(np.mean(ps))}
             for (task, kind), ps in sorted(by_kind.items())}
    print(f"{'task':34s} {'action':14s} {'n':>4s}  p(expert action)")
    for key, row in table.items():
        task, kind = key.rsplit(" ", 1)
        print(f"{task:34s} {kind:14s} {row['n']:4d}  {row['mean_p']:.3f}")
    evaluation = {k: v for k, v in start.items() if "success" in k or "invalid" in k}
    print(json.dumps({"argv": argv, "start": evaluation,
                      "expert_action_p": table}))


if __name__ == "__main__":
    main(sys.argv[1:])
