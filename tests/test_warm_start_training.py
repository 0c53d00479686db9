"""Warm start's training: the supervised step against a numpy NLL, the whole run trained once and
its cached result reused, a goal window scored as in its episode, weight fingerprints, the
extractor's parse probe and the cache's identity."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from crl_jax.config import WarmStartConfig
from crl_jax.run.config_loading import load_config
from crl_jax.memory import prompts
from crl_jax.rl.sft import make_sft_step, sft_batch
from crl_jax.rollout.vocabulary import build_tokenizer
from crl_jax.warm_start import (PROBE_EPISODES, PROBE_MERGES, WarmStartInputs, cache_identity, demos,
                               lessons, params_fingerprint, probe_extractor, run_warm_start)
from tests.warm_start_tasks import SHORT, TASK, nano_state, short_demos


@pytest.fixture(scope="module")
def short_tokenizer():
    return build_tokenizer([SHORT])


def test_sft_loss_matches_numpy_and_decreases(short_tokenizer):
    tokenizer = short_tokenizer
    mesh, state = nano_state(tokenizer)
    examples = demos.actor_examples(tokenizer, short_demos(3))
    batch = sft_batch(examples, 128, 4)        # one padding row
    assert batch.valid.tolist() == [True, True, True, False]
    model = nnx.merge(state.graphdef, state.params)
    logits = np.asarray(model(batch.tokens, positions=batch.positions, attention_mask=batch.attention_mask),
                        np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    tokens, mask = np.asarray(batch.tokens), np.asarray(batch.loss_mask) * np.asarray(batch.valid)[:, None]
    target = np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    assert mask.sum() > 10
    want = -(target * mask[:, 1:]).sum() / mask.sum()
    step = make_sft_step(mesh, state, batch)
    losses = []
    for _ in range(15):
        state, out = step(state, batch)
        losses.append(float(out["loss"]))
    assert losses[0] == pytest.approx(want, rel=1e-5)
    assert float(out["tokens"]) == mask.sum()
    assert losses[-1] < 0.5 * losses[0]


def test_run_warm_start_trains_and_reuses_its_cache(short_tokenizer, tmp_path):
    tokenizer = short_tokenizer
    mesh, actor = nano_state(tokenizer, seed=0)
    _, extractor = nano_state(tokenizer, seed=1)
    before = jax.device_get(actor.params)
    tasks = [{"env": SHORT, "seed": s} for s in range(8)]
    cfg = WarmStartConfig(enabled=True, episodes=8, actor_window=32, window_steps=2, window_batch_size=4,
                          actor_steps=4, extractor_steps=2, merge_examples=2, batch_size=4,
                          learning_rate=1e-3)

    def inputs(a, e):
        # Prompts longer than the extractor's budget are cut (here: all distillation prompts).
        return WarmStartInputs(tokenizer, mesh, a, e, tasks, max_turns=4, actor_max_len=256,
                               extractor_room=150, extractor_max_len=256, seed=0,
                               identity={"actor": {"tasks": [SHORT]}, "extractor": {"model": "nano"}},
                               generate=lambda params, conversations: ["x"] * len(conversations))

    actor_params, ext_params, summary = run_warm_start(cfg, inputs(actor, extractor), str(tmp_path))
    assert summary["actor"]["steps"] == 4 and summary["extractor"]["steps"] == 2
    # The window phase ran first, on one example per action of the 8 demos.
    assert summary["actor_window"]["steps"] == 2
    assert summary["actor_window"]["examples"] > summary["actor"]["examples"] == 8
    assert summary["demos"]["episodes"] == 8
    # The trained extractor was probed (the stand-in sampler's replies never parse).
    assert summary["extractor"]["probe"] == {
        "episodes": PROBE_EPISODES, "parsed": 0.0, "outcomes": {"no_answer": PROBE_EPISODES},
        "parsed_with_lesson": 0.0, "outcomes_with_lesson": {"no_answer": PROBE_EPISODES},
        "merges": PROBE_MERGES, "merge_parsed": 0.0, "merge_outcomes": {"no_items": PROBE_MERGES}}
    changed = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                           jax.device_get(actor_params), before)
    assert max(jax.tree.leaves(changed)) > 0
    curves = {half: [json.loads(line) for line in open(tmp_path / "warm_start" / half / "metrics.jsonl")]
              for half in ("actor", "extractor")}
    assert [r["step"] for r in curves["actor"]] == list(range(6))        # 2 window + 4 actor steps
    assert [r["step"] for r in curves["extractor"]] == [6, 7]

    # A second start of the same run loads the cached parameters instead of training again.
    _, actor2 = nano_state(tokenizer, seed=5)
    _, extractor2 = nano_state(tokenizer, seed=6)
    again, ext_again, summary2 = run_warm_start(cfg, inputs(actor2, extractor2), str(tmp_path))
    assert summary2 == summary
    assert summary["actor_fingerprint"] == params_fingerprint(actor_params) != params_fingerprint(before)
    _assert_same(actor_params, again)
    _assert_same(ext_params, ext_again)

    # A run without an extractor (the GRPO baseline) with the actor's half copied in starts from
    # the very same actor without training; so does a run whose extractor settings differ, which
    # trains its extractor only.
    for name in ("baseline", "more_merges"):
        shutil.copytree(tmp_path / "warm_start" / "actor", tmp_path / name / "warm_start" / "actor")
    _, actor4 = nano_state(tokenizer, seed=7)
    baseline_params, none, baseline = run_warm_start(cfg, inputs(actor4, None), str(tmp_path / "baseline"))
    assert none is None and "extractor" not in baseline
    assert baseline["actor"] == summary["actor"] and baseline["demos"] == summary["demos"]
    assert baseline["actor_fingerprint"] == summary["actor_fingerprint"]
    _assert_same(actor_params, baseline_params)
    _, actor5 = nano_state(tokenizer, seed=8)
    _, ext5 = nano_state(tokenizer, seed=9)
    more = WarmStartConfig(**{**cfg.__dict__, "merge_examples": 3})
    shared, _, summary5 = run_warm_start(more, inputs(actor5, ext5), str(tmp_path / "more_merges"))
    _assert_same(actor_params, shared)
    assert summary5["actor"] == summary["actor"]
    assert summary5["extractor"]["merge"] == 3 and summary["extractor"]["merge"] == 2
    copied_curve = (tmp_path / "more_merges" / "warm_start" / "actor" / "metrics.jsonl").read_text()
    assert len(copied_curve.splitlines()) == 6                             # not trained again
    # A different warm-start configuration does not reuse the cache: the actor's half is rebuilt
    # (asked for without an extractor, whose half would be rebuilt too, to keep the test short).
    _, actor3 = nano_state(tokenizer, seed=5)
    other = WarmStartConfig(**{**cfg.__dict__, "actor_steps": 3})
    _, _, summary3 = run_warm_start(other, inputs(actor3, None), str(tmp_path))
    assert summary3["actor"]["steps"] == 3
    assert summary3["actor_fingerprint"] != summary["actor_fingerprint"]


def test_params_fingerprint_tells_weights_apart_to_the_last_bit():
    params = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    fingerprint = params_fingerprint(params)
    assert 0 <= fingerprint < 2 ** 48 and float(fingerprint) == fingerprint  # exact as a metric
    assert params_fingerprint(jax.tree.map(jax.numpy.asarray, params)) == fingerprint
    nudged = dict(params, b=np.nextafter(params["b"], np.float32(2)))       # one ulp
    renamed = {"a": params["a"], "c": params["b"]}
    reshaped = {"a": params["a"].reshape(3, 2), "b": params["b"]}
    assert len({fingerprint, params_fingerprint(nudged), params_fingerprint(renamed),
                params_fingerprint(reshaped)}) == 4


def _assert_same(tree_a, tree_b):
    for a, b in zip(jax.tree.leaves(jax.device_get(tree_a)), jax.tree.leaves(jax.device_get(tree_b)),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_probe_counts_the_parse_outcomes_of_fresh_distillations_and_merges():
    replies = ["<think>short</think><answer>add(<title>t</title><content>c</content>)</answer>",
               "<answer>return()</answer>", "<answer>add(<title>t</title>)</answer>", "no tags"]
    merge_replies = ["<<<KNOWLEDGE_ITEM>>>\n<title>t</title>\n<content>c</content>\n<<<END_ITEM>>>",
                     "<<<RETURN>>>", "<<<KNOWLEDGE_ITEM>>>\n<title>t</title>", "<content>c</content>"]
    seen = []

    def generate(params, conversations):
        seen.append((params, conversations))
        pool = merge_replies if conversations[0][0]["content"] == prompts.MERGE_SYSTEM else replies
        return [pool[i % len(pool)] for i in range(len(conversations))]

    tasks = [{"env": TASK, "seed": s} for s in range(100, 108)]
    probe = probe_extractor("params", generate, tasks, max_turns=12, seed=5, merges=8, merge_lessons=3)
    assert probe == {"episodes": 8, "parsed": 0.5,
                     "outcomes": {"ok": 2, "return": 2, "unparsable": 2, "no_answer": 2},
                     "parsed_with_lesson": 0.5,
                     "outcomes_with_lesson": {"ok": 2, "return": 2, "unparsable": 2, "no_answer": 2},
                     "merges": 8, "merge_parsed": 0.5,
                     "merge_outcomes": {"ok": 2, "return": 2, "unparsable": 2, "no_items": 2}}
    # Three calls with the extractor's params. First the distillation prompts of unguided episodes
    # (no lesson injected, none retrieved), as RL's distillations of an empty bank look; then the
    # same episodes, each shown one lesson of its family as "Memory Entry 1", as in RL.
    (params, conversations), (_, with_lesson), (merge_params, merges) = seen
    assert params == merge_params == "params" and len(conversations) == len(with_lesson) == 8
    for conversation in conversations:
        assert conversation[0]["content"] == prompts.DISTILL_SYSTEM
        assert prompts.NO_MEMORIES in conversation[1]["content"]
        assert "[Experience notes]" not in conversation[1]["content"]
    family = {demos.render(e) for e in lessons.all_lessons(TASK)}
    for conversation in with_lesson:
        assert prompts.NO_MEMORIES not in conversation[1]["content"]
        assert sum(text in conversation[1]["content"] for text in family) >= 1
    # Then merge prompts of 2 to merge_lessons of the probed family's lessons.
    lesson_texts = {demos.render(e) for e in lessons.all_lessons(TASK)}
    sizes = set()
    for conversation in merges:
        shown = [t for t in lesson_texts if t in conversation[1]["content"]]
        assert shown and conversation[1]["content"].count("<title>") in (2, 3)
        sizes.add(conversation[1]["content"].count("<title>"))
    assert sizes == {2, 3}
    with pytest.raises(ValueError, match="needs >= 2 lessons"):
        probe_extractor("params", generate, tasks, max_turns=12, seed=5, merge_lessons=1)


def test_cache_identity_ignores_how_experience_is_used_only():
    """Runs that differ only in how they use experience share a warm start; anything the warm
    start reads (its settings, the seed, the models, the turn limit, the lengths) separates them."""
    config_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "experiments", "configs")

    def identity(spec, *overrides):
        return cache_identity(load_config(spec, overrides, config_dir=config_dir))

    crl = identity("single_task.py")
    for same in ("single_task.py:static", "single_task.py:exp_only", "single_task.py:no_search",
                 "single_task.py:no_merge", "single_task.py:no_split"):
        assert identity(same) == crl, same
    assert identity("single_task.py", "steps=3", "eval.tasks_per_env=4") == crl
    for override in ("seed=1", "warm_start.window_steps=10", "rollout.max_turns=4", "rl.max_seq_len=1024",
                     "actor.preset=nano", "warm_start.batch_size=3"):
        assert identity("single_task.py", override)["actor"] != crl["actor"], override
    # The extractor's settings separate the extractor's half only: the actor's is shared, with the
    # baseline too (which has no extractor to fine-tune).
    for override in ("extractor.cache_length=640", "warm_start.merge_examples=7",
                     "warm_start.extractor_steps=9", "extractor_model.dtype=bfloat16"):
        other = identity("single_task.py", override)
        assert other["actor"] == crl["actor"] and other["extractor"] != crl["extractor"], override
    baseline = identity("single_task.py:baseline")
    assert baseline == {"actor": crl["actor"], "extractor": None}


def test_a_goal_window_scores_its_action_as_the_whole_episode_does(short_tokenizer):
    """With explicit positions, a window with a gap computes at its tokens what the whole episode
    computes there when the gap's tokens are hidden from attention (RoPE scores depend on position
    differences only): the goal is read at the distance it has in the episode."""
    mesh, state = nano_state(short_tokenizer)
    ids, mask = demos.actor_examples(short_tokenizer, short_demos(1))[0]
    (g0, g1), = demos.goal_spans(short_tokenizer, short_demos(1))
    last = demos.action_windows([(ids, mask)], window=8, goals=[(g0, g1)])[-1]
    w_ids, w_mask, w_pos = last
    assert w_pos[0] == g0 and w_pos[-1] == np.flatnonzero(mask)[-1] and w_pos[1] - w_pos[0] == 1
    assert len(w_ids) < w_pos[-1] + 1 - g0      # a gap: the window is not one contiguous piece
    model = nnx.merge(state.graphdef, state.params)
    window_batch = sft_batch([last], 128, 1)
    window_logits = np.asarray(model(window_batch.tokens, positions=window_batch.positions,
                                     attention_mask=window_batch.attention_mask))[0, :len(w_ids)]
    keep = np.zeros(len(ids), bool)
    keep[w_pos] = True                      # the full sequence, other tokens hidden from attention
    full = np.asarray(model(ids[None], positions=np.arange(len(ids))[None],
                            attention_mask=keep[None]))[0]
    np.testing.assert_allclose(window_logits, full[w_pos], atol=1e-5)
