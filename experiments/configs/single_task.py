"""Single-task Complementary RL: the embedded CPU default (MiniHack Room-Ultimate-5x5, lit; tiny models).

    python experiments/run.py --config=single_task.py
    python experiments/run.py --config=single_task.py:dark          # the paper's dark room
    python experiments/run.py --config=single_task.py:baseline      # GRPO without experience
    python experiments/run.py --config=single_task.py:static        # static online experience
    python experiments/run.py --config=single_task.py:exp_only      # experience only (actor frozen)
    python experiments/run.py --config=single_task.py:no_merge
    python experiments/run.py --config=single_task.py:no_search     # no search_and_ask
    python experiments/run.py --config=single_task.py:no_split      # one advantage group per task
    python experiments/run.py --config=single_task.py:cross_group   # normalise across the batch
    python experiments/run.py --config=single_task.py:paper         # paper-scale models (TPU/GPU)
    python experiments/run.py --config=single_task.py:smoke         # 2 steps in minutes: a check
    python experiments/run.py --config=single_task.py --config.steps=50 --config.rollout.group_size=4

Variants combine with commas, e.g. `single_task.py:static,no_merge`.
"""

from ml_collections import config_dict

VARIANTS = ("dark", "baseline", "static", "exp_only", "no_merge", "no_search", "no_split", "cross_group",
            "paper", "smollm2", "smoke")


def base_config() -> config_dict.ConfigDict:
    c = config_dict.ConfigDict()
    # The paper's pilot room, lit: in the dark one a tiny model has to learn exploration, which it
    # does not in minutes (docs/embedded_default.md). `:dark` restores the paper's task.
    c.tasks = ("minihack/room-ultimate-lit-5x5",)
    # Sized to finish on a 2-core CPU; the paper's scale is the `paper` variant.
    c.steps = 20
    c.seed, c.tokenizer, c.mesh_shape, c.data_dir, c.log_every = 0, "word", (1, -1, 1), "", 1
    # Small enough for 15 minutes on two CPU cores, where attention over ~700-token episodes
    # dominates: a ~1M-parameter actor ("micro") and a ~0.1M extractor ("nano"), whose prompts
    # (instructions + whole transcript) are twice as long.
    c.actor = dict(preset="micro", path="", dtype="float32", param_dtype="float32", remat="none")
    c.extractor_model = dict(preset="nano", path="", dtype="float32", param_dtype="float32", remat="none")
    c.rollout = dict(groups_per_step=4, group_size=8, free_per_group=4, max_turns=5, max_new_tokens=24,
                     cache_length=1280, temperature=0.99, top_p=0.99, top_k=100, search_and_ask=True,
                     max_tool_uses=2, step_timeout_s=30.0)
    # Merging every 10 steps, not the paper's 5: each merge pass costs ~20 s here.
    c.memory = dict(enabled=True, capacity=20_000, merge_every=10, merge_chunk=5, warmup_steps=2,
                    embedder="minilm", diversity_lambda=0.4, candidate_multiplier=16, recency_steps=1,
                    demote_probability=0.5)
    # Distillation prompts longer than the cache lose the middle of the transcript (see
    # rollout.extractor.prompt_ids); a lower temperature keeps the small extractor's operations
    # well formed. 384 new tokens: a merge writes every lesson it keeps in full, up to ~340 tokens
    # for a family's four lessons (at 128 every merge of two or more distinct lessons was cut off
    # and lost); 896 tokens of room for a merge chunk with the lessons carried into it.
    # tests/test_experiment_configs.py checks both for every setting.
    # Batch 4, not the paper's 64: a step uses at most groups_per_step distinct entries (a group's
    # guided episodes share one query). At 16 the extractor trained once (docs/embedded_default.md).
    c.extractor = dict(train=True, batch_size=4, cooldown_steps=1, weight_power=0.5, max_new_tokens=384,
                       cache_length=1280, temperature=0.7, top_p=0.99)
    # Actor lr 8e-4: at 1e-4, twenty steps barely move a ~1M-parameter model. From one warm start,
    # 20 steps at 5e-4 / 8e-4 ended at 0.38 / 0.44 test success (128 rooms), and 1.5e-3 at 0.27
    # (64 rooms) with twice the invalid actions. One extractor batch shape: a first run compiles 2
    # update programs instead of 6 (docs/benchmarks.md), for a padded nano update on every step.
    # The LM head only at trained tokens: an update trains 186-469 of the actor's 32 x 1280 and
    # at most 4 x 384 of the extractor's, both under 2048.
    c.rl = dict(train_actor=True, advantage_normalization="mean_std", advantage_split="subgroup",
                clip_eps=0.2, cispo_eps=0.1, aggregation="seq_mean_token_mean", learning_rate=8e-4,
                extractor_learning_rate=1e-4, weight_decay=0.0, max_grad_norm=1.0, micro_batches=1,
                old_logprobs="sampler", max_seq_len=1280, fixed_extractor_batch=True,
                logprob_positions=2048)
    # Before and after RL only, on 128 test rooms each way: with 64, sampling alone moved the
    # measured success by up to 0.1 (the same actors scored 0.33 and 0.24 on 64 and 100 rooms),
    # as much as the change to measure. The training curves show the steps in between.
    c.eval = dict(every=0, tasks_per_env=128, at_start=True, with_experience=True, without_experience=True)
    # Tiny models start from random weights: behaviour cloning on scripted episodes (some with
    # random actions), first on the 96 tokens before each action (cheap, and where the actor
    # learns to read the observation; whole episodes alone left it at chance), then on whole
    # episodes; and SFT of the extractor on scripted summaries. 500 window steps, not 300: the
    # window loss drops from ~0.4 to ~0.2 at a seed-dependent step (seed 0 by step 210), and
    # seed 1's warm start reached 0.16 test success with 300, 0.34 with 500. The nano extractor
    # does not learn merges from 16 examples (none of a run's merge replies parses), but 128
    # examples of 2-8 lessons over 200 steps cost its distillations: 130 of 272 unparsable in a
    # run, against 6 of 288, for merges parsing in 1 of 6 calls. Distillation matters more.
    c.warm_start = dict(enabled=True, episodes=512, epsilons=(0.0, 0.25, 0.5), guided_fraction=0.5,
                        search_fraction=0.2, actor_window=96, window_steps=500, window_batch_size=32,
                        window_goal=False,
                        actor_steps=20, extractor_steps=120, merge_examples=16,
                        batch_size=8, learning_rate=3e-3, extractor_learning_rate=5e-3)
    c.checkpoint = dict(every=10, keep=3)
    return config_dict.ConfigDict(c)


def _paper_scale(c: config_dict.ConfigDict) -> None:
    """The paper's scale (TPU/GPU): Qwen2.5-7B actor at 32k tokens, Qwen3-4B extractor at 64k."""
    # The checkpoint folders are config values that must be given:
    # --config.actor.path=/ckpt/Qwen2.5-7B-Instruct --config.extractor_model.path=/ckpt/Qwen3-4B
    # --config.memory.embedder=/ckpt/Qwen3-Embedding-0.6B
    c.actor.update(preset="qwen2.5-7b", dtype="bfloat16", param_dtype="bfloat16", remat="full")
    c.extractor_model.update(preset="qwen3-4b", dtype="bfloat16", param_dtype="bfloat16", remat="full")
    c.tokenizer = "actor"
    c.steps = 145
    c.rollout.update(groups_per_step=16, group_size=8, free_per_group=4, max_new_tokens=4096,
                     cache_length=32768, max_turns=30)
    c.actor.path = c.extractor_model.path = c.memory.embedder = "REQUIRED: a checkpoint folder"
    c.memory.update(warmup_steps=5, merge_every=5)
    c.warm_start.enabled = False  # pretrained models
    c.extractor.update(batch_size=64, max_new_tokens=8192, cache_length=65536)
    # An extractor update at 64 x 64k tokens on every step would cost more than the compiles
    # its fixed shape saves: the extractor's batches keep their length buckets.
    # Every position through the head, as the memory fit (benchmarks/aot_tpu.py) was measured.
    c.rl.update(learning_rate=1e-6, extractor_learning_rate=1e-6, max_seq_len=32768,
                micro_batches=2, old_logprobs="recompute", fixed_extractor_batch=False,
                logprob_positions=0)
    c.mesh_shape = (1, -1, 4)


def apply_variant(c: config_dict.ConfigDict, variant: str) -> None:
    if variant == "dark":
        c.tasks = ("minihack/room-ultimate-5x5",)
    elif variant == "baseline":
        c.memory.enabled = False
        c.rollout.free_per_group = c.rollout.group_size
        c.rollout.search_and_ask = False
    elif variant == "static":
        c.extractor.train = False
    elif variant == "exp_only":
        c.rl.train_actor = False
    elif variant == "no_merge":
        c.memory.merge_every = 0
    elif variant == "no_search":
        c.rollout.search_and_ask = False
    elif variant == "no_split":
        c.rl.advantage_split = "group"
    elif variant == "cross_group":
        c.rl.advantage_split = "batch"
    elif variant == "paper":
        _paper_scale(c)
    elif variant == "smollm2":
        c.actor.path = "smollm2"
        c.extractor_model.path = "smollm2"
        c.tokenizer = "actor"
        # Step 0 only fills the bank (memory warm-up: no update); step 1 retrieves and updates
        # the actor, and the extractor once one of its entries has been used.
        c.steps = 2
        c.memory.warmup_steps = 1
        c.warm_start.enabled = False  # an instruct model already
        c.rollout.update(groups_per_step=1, group_size=2, free_per_group=1, max_turns=2, max_new_tokens=16)
        c.extractor.update(batch_size=1, max_new_tokens=32)
        c.eval.update(every=0, tasks_per_env=1)
    elif variant == "smoke":
        # The whole pipeline in a few minutes (warm start, start evaluation, 2 RL steps, one merge,
        # checkpoint, report), to check an install; its numbers mean nothing. CI runs it.
        c.steps = 2
        c.memory.update(warmup_steps=1, merge_every=2)
        c.rollout.update(groups_per_step=2, group_size=4, free_per_group=2)
        c.extractor.batch_size = 2
        c.warm_start.update(episodes=32, window_steps=20, actor_steps=2, extractor_steps=10,
                            merge_examples=4)
        c.eval.tasks_per_env = 4
        c.checkpoint.every = 1
    else:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    c = base_config()
    for variant in filter(None, (arg or "").split(",")):
        apply_variant(c, variant.strip())
    return c
