"""Warm start: scripted demos in the actor loop's exact format, well-formed extractor targets, the
supervised step against a numpy NLL, and the cached result reused."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from crl_jax import envs, models, sharding
from crl_jax.config import ConfigError, WarmStartConfig, from_dict
from crl_jax.run.config_loading import load_config
from crl_jax.memory import ops, prompts
from crl_jax.rl.sft import make_sft_step, sft_batch
from crl_jax.rollout.extractor import prompt_ids
from crl_jax.rl.state import OptimizerConfig, create_sharded_state, make_optimizer
from crl_jax.rollout.vocabulary import build_tokenizer
from crl_jax.shapes import length_bucket
from crl_jax.warm_start import (PROBE_EPISODES, PROBE_MERGES, WarmStartInputs, cache_identity, demos,
                               lessons, params_fingerprint, probe_extractor, rows_per_batch, run_warm_start)

TASK = "sokoban/6x6-2box"   # a real environment: fast to reset, has a scripted expert
SHORT = "test/corridor"     # short prompts, so the JAX tests compile one small shape
envs.register(SHORT, "tests.corridor_env", "CorridorEnv")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([TASK])


@pytest.fixture(scope="module")
def short_tokenizer():
    return build_tokenizer([SHORT])


def short_demos(n=8):
    tasks = [{"env": SHORT, "seed": s} for s in range(n)]
    return demos.collect_demos(tasks, max_turns=4, epsilons=(0.0, 1.0), guided_fraction=0.0,
                               search_fraction=0.0, tools=False, seed=0)


@pytest.fixture(scope="module")
def demo_set():
    tasks = [{"env": TASK, "seed": s} for s in range(12)]
    return demos.collect_demos(tasks, max_turns=12, epsilons=(0.0, 1.0), guided_fraction=0.5,
                               search_fraction=1.0, tools=True, seed=3)


def test_demos_follow_the_actor_loop_format(demo_set, tokenizer):
    experts = [d for d in demo_set if d.epsilon == 0.0]
    randoms = [d for d in demo_set if d.epsilon == 1.0]
    # Pure expert play solves the task; pure random play mostly does not: the mix is imperfect.
    assert all(d.facts.success for d in experts)
    assert np.mean([d.facts.success for d in randoms]) < 0.5
    guided = [d for d in demo_set if d.entry is not None]
    assert guided and len(guided) < len(demo_set)
    for d in demo_set:
        system = d.messages[0]["content"]
        assert (prompts.SEARCH_TOOL_TEXT in system) == (d.entry is not None)
        if d.entry is not None:
            assert d.entry[1] in system and prompts.strip_injection(system).find(d.entry[1]) < 0
        assert d.messages[-1]["role"] == "assistant"
        roles = [m["role"] for m in d.messages[1:]]
        assert roles[::2] == ["user"] * len(roles[::2]) and roles[1::2] == ["assistant"] * len(roles[1::2])
        # Every action turn is one answer tag; a searched demo opens with the tool call.
        answers = [m["content"] for m in d.messages if m["role"] == "assistant"]
        if d.searched:
            assert answers[0].startswith(prompts.SEARCH_OPEN) and answers[0].endswith(prompts.SEARCH_CLOSE)
            assert d.messages[3]["content"].startswith("Search results: ")
            answers = answers[1:]
        assert len(answers) == d.facts.actions
        assert all(a.startswith("<answer>") and a.endswith("</answer>") for a in answers)
    # The BC targets are exactly the assistant turns, and the tokenizer knows every word of them.
    ids, mask = demos.actor_examples(tokenizer, demo_set[:1])[0]
    trained = tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)
    assert trained == "".join(m["content"] for m in demo_set[0].messages if m["role"] == "assistant")
    assert tokenizer.token_id("<unk>") not in ids[mask].tolist()


def test_extractor_targets_parse_as_bank_operations(demo_set, tokenizer):
    examples, counts = demos.extractor_examples(tokenizer, demo_set, room=900, merges=20, seed=0)
    # An unguided demo is distilled twice, without and with a lesson shown, as RL shows one.
    unguided = sum(d.entry is None for d in demo_set)
    assert unguided and counts["distill"] == len(demo_set) + unguided
    assert counts["refine"] == sum(d.searched for d in demo_set)
    assert counts["merge"] == 20 and len(examples) == sum(counts.values())
    prompts_seen = [tokenizer.decode(ids[~mask].tolist()) for ids, mask in examples]
    distills = [p for p in prompts_seen if "## Outcome" in p]
    assert len(distills) == counts["distill"]
    assert sum("Memory Entry 1:" in p for p in distills) == len(demo_set)  # one per demo
    kinds = {"ok": 0, "return": 0}
    for demo in demo_set:
        retrieved = [demo.entry] if demo.entry else []
        parsed = ops.parse_operations(lessons.distill_reply(demo.facts, retrieved), len(retrieved))
        assert parsed.reason in ("ok", "return"), parsed.reason
        kinds[parsed.reason] += 1
    assert kinds["ok"] > 0
    for ids, mask in examples:
        assert len(ids) - mask.sum() <= 900          # prompts cut to the extractor's budget
        assert tokenizer.decode(ids[mask].tolist()).endswith("<|im_end|>")
        assert tokenizer.token_id("<unk>") not in ids[mask].tolist()
    # A prompt cut to the budget keeps the instructions, the outcome and the generation prompt.
    long = max(demo_set, key=lambda d: len(d.messages))
    messages = prompts.distill_messages(long.facts.success, long.messages, [])
    cut = tokenizer.decode(prompt_ids(tokenizer, messages, 700))
    assert len(prompt_ids(tokenizer, messages, 700)) == 700
    assert prompts.DISTILL_SYSTEM[-40:] in cut and ("SUCCESS" if long.facts.success else "FAILURE") in cut
    assert cut.endswith("<|im_start|>assistant\n") and prompts.NO_MEMORIES in cut
    # Merge chunks: 2 to merge_lessons lessons of one family each.
    families = [lessons.all_lessons(TASK), lessons.all_lessons("shop/v1")]
    chunks = demos.lesson_chunks([TASK, "shop/v1"], 200, 5, np.random.default_rng(0))
    assert {len(c) for c in chunks} == {2, 3, 4, 5}
    assert all(any(set(c) <= set(f) for f in families) for c in chunks)
    # Merge replies: duplicates collapse into items, a distinct chunk is kept as it is.
    a, b = lessons.all_lessons(TASK)[:2]
    items, reason = ops.parse_merge(lessons.merge_reply([a, b, a]))
    assert reason == "ok" and sorted(items) == sorted([a, b])
    assert ops.parse_merge(lessons.merge_reply([a, b]))[1] == "return"


def test_situation_picks_lesson_by_outcome():
    facts = lambda **kw: lessons.EpisodeFacts(**{"task": "minihack/room-ultimate-5x5", "success": True,  # noqa: E731
                                                 "actions": 2, "invalid_actions": 0, "max_turns": 30, **kw})
    assert lessons.situation(facts()) == "fast"
    assert lessons.situation(facts(actions=20)) == "slow"
    assert lessons.situation(facts(success=False)) == "fail"
    assert lessons.situation(facts(success=False, invalid_actions=3)) == "format"
    assert lessons.family("shop/x") == "shop" and lessons.family("unknown/x") == "generic"
    # In a lit room the goal is always in view: a slow success still teaches going straight for
    # it, never the dark room's exploration lesson.
    lit = lambda **kw: facts(task="minihack/room-ultimate-lit-5x5", **kw)  # noqa: E731
    assert lessons.family(lit().task) == "minihack-lit"
    assert lessons.lesson(lit(actions=20)) == lessons.lesson(lit()) == lessons.expert_lesson(lit().task)
    assert "dark" in lessons.lesson(facts(actions=20))[1]
    assert not any("dark" in content for _, content in lessons.all_lessons(lit().task))
    assert lessons.lesson(lit(success=False))[0] == "go around what blocks the way"


def test_length_bucket():
    assert [length_bucket(n, 1024) for n in (1, 256, 257, 600, 5000)] == [256, 256, 512, 768, 1024]


def test_action_windows_cut_one_example_per_action():
    ids = np.arange(20, dtype=np.int32)
    mask = np.zeros(20, bool)
    mask[[3, 4, 9, 10, 11, 18, 19]] = True         # three actions (spans)
    windows = demos.action_windows([(ids, mask)], window=5)
    assert len(windows) == 3
    for (w_ids, w_mask), (start, end) in zip(windows, [(3, 5), (9, 12), (18, 20)]):
        # Each window ends with its action, holds at most `window` tokens before that end, and
        # trains that action's tokens only.
        assert w_ids[-1] == end - 1 and len(w_ids) == min(5, end)
        np.testing.assert_array_equal(w_ids[w_mask], np.arange(start, end))
    # A span longer than the window keeps its last tokens.
    long = demos.action_windows([(ids, np.ones(20, bool))], window=4)
    assert len(long) == 1 and long[0][0].tolist() == [16, 17, 18, 19] and long[0][1].all()
    with pytest.raises(ValueError, match="window"):
        demos.action_windows([(ids, mask)], window=0)


def test_goal_windows_keep_the_goal_at_its_true_distance():
    ids = np.arange(40, dtype=np.int32) + 100
    mask = np.zeros(40, bool)
    mask[[12, 13, 30, 31]] = True                   # two actions; the goal message is tokens 4..8
    windows = demos.action_windows([(ids, mask)], window=6, goals=[(4, 9)])
    assert len(windows) == 2
    # The first window reaches into the goal: one contiguous piece from the goal's start.
    first_ids, first_mask, first_pos = windows[0]
    assert first_pos.tolist() == list(range(4, 14))
    np.testing.assert_array_equal(first_ids, ids[4:14])
    assert first_mask.tolist() == [False] * 8 + [True, True]
    # The second: the goal, then the last 6 tokens, each at its position in the episode.
    ids2, mask2, pos2 = windows[1]
    assert pos2.tolist() == [4, 5, 6, 7, 8] + list(range(26, 32))
    np.testing.assert_array_equal(ids2, ids[pos2])
    np.testing.assert_array_equal(pos2[mask2], [30, 31])
    with pytest.raises(ValueError, match="goal spans"):
        demos.action_windows([(ids, mask)], window=6, goals=[])


def test_goal_windows_fit_max_len_without_losing_their_action():
    """A batch cuts examples at its length from the end, which would drop the action: windows
    that would pass `max_len` keep fewer tokens before their action instead."""
    ids = np.arange(40, dtype=np.int32) + 100
    mask = np.zeros(40, bool)
    mask[[12, 13, 30, 31]] = True                   # the goal message is tokens 4..8
    windows = demos.action_windows([(ids, mask)], window=6, goals=[(4, 9)], max_len=8)
    # One piece from the goal (10 tokens) keeps its last 8; goal (5) + page keeps 3 page tokens.
    assert windows[0][2].tolist() == list(range(6, 14))
    assert windows[1][2].tolist() == [4, 5, 6, 7, 8, 29, 30, 31]
    for w_ids, w_mask, w_pos in windows:
        assert len(w_ids) <= 8
        np.testing.assert_array_equal(w_ids, ids[w_pos])
        assert w_mask.sum() == 2 and w_mask[-2:].all()  # the whole action, still trained
    # Lengths that fit are untouched.
    roomy = demos.action_windows([(ids, mask)], window=6, goals=[(4, 9)], max_len=64)
    assert [w[2].tolist() for w in roomy] == [w[2].tolist() for w in
                                              demos.action_windows([(ids, mask)], window=6, goals=[(4, 9)])]
    with pytest.raises(ValueError, match="does not fit max_len=6"):
        demos.action_windows([(ids, mask)], window=6, goals=[(4, 9)], max_len=6)
    with pytest.raises(ValueError, match="shorter than the window"):
        demos.action_windows([(ids, mask)], window=6, max_len=4)


def test_goal_spans_find_the_first_user_message(short_tokenizer):
    demo = short_demos(1)[0]
    (start, end), = demos.goal_spans(short_tokenizer, [demo])
    ids = short_tokenizer.encode_chat(demo.messages).ids
    assert short_tokenizer.decode(ids[start:end]).count(demo.messages[1]["content"]) == 1
    assert 0 < start < end < len(ids)


def test_rows_per_batch_share_a_token_budget():
    assert rows_per_batch(128, 32) == 32                       # no budget: fixed rows
    assert [rows_per_batch(n, 32, 3072) for n in (96, 128, 512, 4096)] == [32, 24, 6, 1]


def test_a_goal_window_scores_its_action_as_the_whole_episode_does(short_tokenizer):
    """With explicit positions, a window with a gap computes at its tokens what the whole episode
    computes there when the gap's tokens are hidden from attention (RoPE scores depend on position
    differences only): the goal is read at the distance it has in the episode."""
    mesh, state = _nano_state(short_tokenizer)
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


def test_window_phase_needs_a_window():
    with pytest.raises(ConfigError, match="actor_window"):
        from_dict({"warm_start": {"enabled": True, "window_steps": 5, "actor_window": 0}})
    with pytest.raises(ConfigError, match="merge_lessons: a merge example needs >= 2 lessons; got 1"):
        from_dict({"warm_start": {"enabled": True, "merge_lessons": 1}})


def _nano_state(vocab, seed=0, lr=1e-2):
    cfg = models.get_preset("nano", vocab_size=vocab.vocab_size, eos_token_id=vocab.eos_id,
                            pad_token_id=vocab.pad_id)
    mesh = sharding.make_mesh((1, -1, 1))
    tx = make_optimizer(OptimizerConfig(learning_rate=lr))
    return mesh, create_sharded_state(lambda rngs: models.Decoder(cfg, rngs=rngs), tx, mesh, seed)


def test_sft_loss_matches_numpy_and_decreases(short_tokenizer):
    tokenizer = short_tokenizer
    mesh, state = _nano_state(tokenizer)
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
    mesh, actor = _nano_state(tokenizer, seed=0)
    _, extractor = _nano_state(tokenizer, seed=1)
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
    _, actor2 = _nano_state(tokenizer, seed=5)
    _, extractor2 = _nano_state(tokenizer, seed=6)
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
    _, actor4 = _nano_state(tokenizer, seed=7)
    baseline_params, none, baseline = run_warm_start(cfg, inputs(actor4, None), str(tmp_path / "baseline"))
    assert none is None and "extractor" not in baseline
    assert baseline["actor"] == summary["actor"] and baseline["demos"] == summary["demos"]
    assert baseline["actor_fingerprint"] == summary["actor_fingerprint"]
    _assert_same(actor_params, baseline_params)
    _, actor5 = _nano_state(tokenizer, seed=8)
    _, ext5 = _nano_state(tokenizer, seed=9)
    more = WarmStartConfig(**{**cfg.__dict__, "merge_examples": 3})
    shared, _, summary5 = run_warm_start(more, inputs(actor5, ext5), str(tmp_path / "more_merges"))
    _assert_same(actor_params, shared)
    assert summary5["actor"] == summary["actor"]
    assert summary5["extractor"]["merge"] == 3 and summary["extractor"]["merge"] == 2
    copied_curve = (tmp_path / "more_merges" / "warm_start" / "actor" / "metrics.jsonl").read_text()
    assert len(copied_curve.splitlines()) == 6                             # not trained again
    # A different warm-start configuration does not reuse the cache: the actor's half is rebuilt
    # (asked for without an extractor, whose half would be rebuilt too, to keep the test short).
    _, actor3 = _nano_state(tokenizer, seed=5)
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
