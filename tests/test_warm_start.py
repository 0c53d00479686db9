"""Warm start's data: scripted demos in the actor loop's exact format, well-formed extractor
targets, lessons by outcome, and the windows cut from long episodes. Its training:
test_warm_start_training.py."""

import numpy as np
import pytest

from crl_jax.config import ConfigError, from_dict
from crl_jax.memory import ops, prompts
from crl_jax.rollout.extractor import prompt_ids
from crl_jax.rollout.vocabulary import build_tokenizer
from crl_jax.shapes import length_bucket
from crl_jax.warm_start import demos, lessons, rows_per_batch
from tests.warm_start_tasks import SHORT, TASK, short_demos


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([TASK])


@pytest.fixture(scope="module")
def short_tokenizer():
    return build_tokenizer([SHORT])


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


def test_window_phase_needs_a_window():
    with pytest.raises(ConfigError, match="actor_window"):
        from_dict({"warm_start": {"enabled": True, "window_steps": 5, "actor_window": 0}})
    with pytest.raises(ConfigError, match="merge_lessons: a merge example needs >= 2 lessons; got 1"):
        from_dict({"warm_start": {"enabled": True, "merge_lessons": 1}})
