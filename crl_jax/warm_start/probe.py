"""The extractor probe: before RL, does the warmed-up extractor write operations and merges that
parse? Its SFT loss alone does not say."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import numpy as np

from crl_jax.memory import ops, prompts
from crl_jax.warm_start import demos as demos_lib
from crl_jax.warm_start import lessons as lessons_lib

# The extractor probe: this many scripted episodes it was not trained on (unguided, with more
# random actions than the demos, like the failing episodes RL starts from), each distilled once.
PROBE_EPISODES = 32
PROBE_EPSILONS = (0.25, 0.5, 1.0)
# ... and this many merge calls, each on 2 to warm_start.merge_lessons of the probed families'
# lessons (drawn afresh, so chunks the SFT did not show, of lessons it did).
PROBE_MERGES = 16
# Below this share of parsed distillations the bank would stay (nearly) empty: warn.
PROBE_WARN_BELOW = 0.25

# (extractor params, conversations) -> the extractor's reply to each, sampled as in RL.
Generate = Callable[[object, Sequence[Sequence[dict]]], list[str]]



def probe_extractor(params, generate: Generate, tasks: Sequence[dict], *, max_turns: int, seed: int,
                    merges: int = PROBE_MERGES, merge_lessons: int = 4) -> dict:
    """Parse outcomes of the extractor's distillations of fresh scripted episodes of `tasks`
    (ops.parse_operations reasons) and of its merges of `merges` chunks of 2 to `merge_lessons`
    of their families' lessons (ops.parse_merge reasons); `parsed` and `merge_parsed` are the
    shares that parse (an operation or return(); merged items or <<<RETURN>>>).

    The warm start's SFT loss does not say whether the extractor writes well-formed operations:
    with six task families, 120 steps ended at loss 1.7 and no distillation of a run parsed; and
    with 16 merge examples among ~700, none of a run's merges parsed."""
    if merges and merge_lessons < 2:
        raise ValueError(f"a merge chunk needs >= 2 lessons; got merge_lessons={merge_lessons}")
    demos = demos_lib.collect_demos(tasks, max_turns=max_turns, epsilons=PROBE_EPSILONS,
                                    guided_fraction=0.0, search_fraction=0.0, tools=True, seed=seed)
    replies = generate(params, [prompts.distill_messages(
        d.facts.success, prompts.distill_transcript(d.messages, d.final_observation), []) for d in demos])
    parses = [ops.parse_operations(text, 0) for text in replies]
    out = {"episodes": len(demos), "parsed": sum(p.ok for p in parses) / max(1, len(demos)),
           "outcomes": dict(collections.Counter(p.reason for p in parses))}
    # In RL every distilled episode was guided: its prompt also shows the lesson it was given. The
    # same episodes again, each with a lesson of its family (on the diagnostic, 97% parsed without
    # one while 5% of a run's distillations did).
    rng = np.random.default_rng([seed, 13])
    shown = [lessons_lib.all_lessons(d.task) for d in demos]
    shown = [options[int(rng.integers(len(options)))] for options in shown]
    replies = generate(params, [prompts.distill_messages(
        d.facts.success, prompts.distill_transcript(d.messages, d.final_observation),
        [demos_lib.render(lesson)]) for d, lesson in zip(demos, shown)])
    parses = [ops.parse_operations(text, 1) for text in replies]
    out.update(parsed_with_lesson=sum(p.ok for p in parses) / max(1, len(demos)),
               outcomes_with_lesson=dict(collections.Counter(p.reason for p in parses)))
    chunks = demos_lib.lesson_chunks(sorted({t["env"] for t in tasks}), merges, merge_lessons,
                                     np.random.default_rng([seed, 11]))
    if chunks:
        reasons = [ops.parse_merge(text)[1] for text in
                   generate(params, [prompts.merge_messages([demos_lib.render(e) for e in c])
                                     for c in chunks])]
        out.update(merges=len(chunks), merge_parsed=sum(r in ("ok", "return") for r in reasons) / len(chunks),
                   merge_outcomes=dict(collections.Counter(reasons)))
    return out
