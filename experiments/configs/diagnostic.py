"""The drifting-doors diagnostic (crl_jax/envs/doors.py, docs/diagnostic.md): a task where
experience is necessary and its facts drift every 6 RL steps.

    python experiments/run.py --config=diagnostic.py                  # Comp. RL
    python experiments/run.py --config=diagnostic.py:baseline         # GRPO without experience
    python experiments/run.py --config=diagnostic.py:static           # static online experience
    python experiments/run.py --config=diagnostic.py:exp_only         # experience only

Every single-task variant applies. The sizes keep a run to a few minutes on two CPU cores.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import single_task  # noqa: E402


def get_config(arg: str | None = None):
    c = single_task.base_config()
    c.tasks = ("diag/doors",)
    # 24 steps: the facts drift at steps 6, 12 and 18, so each method meets three drifts.
    c.steps = 24
    # Two turns, and prompts of ~100 tokens: small caches. A distillation reply is ~40 tokens, a
    # merge of three facts ~110.
    c.rollout.update(max_turns=2, max_new_tokens=8, cache_length=256, search_and_ask=False)
    c.memory.update(warmup_steps=1, merge_every=6, merge_chunk=3)
    c.extractor.update(max_new_tokens=128, cache_length=768)
    c.rl.max_seq_len = 256
    # Every 3 steps, 64 test episodes each way with the facts of that step: the success right
    # after a drift is what separates a bank that follows the facts from one that does not.
    c.eval.update(every=3, tasks_per_env=64)
    # Whole episodes are ~100 tokens, so no action windows: the actor must see the injected advice.
    # No search-and-ask (two turns leave no room for a question).
    c.warm_start.update(episodes=256, window_steps=0, actor_steps=200, batch_size=16, search_fraction=0.0,
                        extractor_steps=300, merge_examples=16)

    c.checkpoint.every = 6
    for variant in filter(None, (arg or "").split(",")):
        single_task.apply_variant(c, variant.strip())
    return c
