"""The parsers of model text take time linear in their input, repetition loops included.

Small models fall into loops; a parser that backtracks quadratically on them stalls the trainer
(a lazy-group regex took 0.27 s on 32 KB of `</title><content>b`). Each input family is parsed at
8, 16, 32 and 64 KB (the input cap): the slowest must stay under 50 ms, and going from 8 to 64 KB
may cost at most 16x (linear growth is 8x, quadratic 64x). Each time is the best of several
rounds, and every round times all four sizes in turn, so that a stretch of load from a parallel
test worker slows all sizes alike instead of only the later ones; the garbage collector is paused
while timing, since a collection walks the whole test process's heap whatever the input's size.
"""

import gc
import time

import pytest

from crl_jax.memory import ops

SIZES_KB = (8, 16, 32, 64)


def repeat_to(prefix: str, unit: str, suffix: str, kb: int) -> str:
    n = (kb * 1024 - len(prefix) - len(suffix)) // len(unit)
    return prefix + unit * n + suffix


MERGE_LOOPS = {
    "title_content_loop": ("<<<KNOWLEDGE_ITEM>>><title>a", "</title><content>b", "<<<END_ITEM>>>"),
    "unclosed_items": ("", "<<<KNOWLEDGE_ITEM>>><title>a</title>", ""),
    "many_items": ("", "<<<KNOWLEDGE_ITEM>>><title>a</title><content>b</content><<<END_ITEM>>>", ""),
    "open_titles": ("<<<KNOWLEDGE_ITEM>>>", "<title>", "</content><<<END_ITEM>>>"),
}
OPERATION_LOOPS = {
    "title_content_loop": ("<answer>add(<title>a", "</title><content>b", "</content>)</answer>"),
    "returns": ("<answer>", "return()", "</answer>"),
    "answers": ("", "<answer>add(", "</answer>"),
    "nested_json": ("<answer>", "[", "</answer>"),
    "glue": ("<answer>", " ,[\"' ", "return()</answer>"),
}


def best_times(fn, texts: list[str], rounds: int = 7) -> list[float]:
    """Best time of `fn` on each text over `rounds` rounds, each round timing every text once."""
    best = [float("inf")] * len(texts)
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for i, text in enumerate(texts):
                start = time.perf_counter()
                fn(text)
                best[i] = min(best[i], time.perf_counter() - start)
    finally:
        if collecting:
            gc.enable()
    return best


def assert_linear(fn, parts):
    times = best_times(fn, [repeat_to(*parts, kb) for kb in SIZES_KB])
    assert max(times) < 0.05, times
    # A floor of 0.1 ms keeps the ratio meaningful when the small input is parsed in microseconds.
    assert times[-1] / max(times[0], 1e-4) <= 16, times


@pytest.mark.parametrize("family", sorted(MERGE_LOOPS))
def test_parse_merge_is_linear(family):
    assert_linear(ops.parse_merge, MERGE_LOOPS[family])


@pytest.mark.parametrize("family", sorted(OPERATION_LOOPS))
def test_parse_operations_is_linear(family):
    assert_linear(lambda text: ops.parse_operations(text, num_retrieved=3), OPERATION_LOOPS[family])


def test_the_loop_is_rejected_and_a_real_merge_still_parses():
    assert ops.parse_merge(repeat_to(*MERGE_LOOPS["title_content_loop"], 64)) == ((), "unparsable")
    text = ("<<<KNOWLEDGE_ITEM>>>\n<title>a</title>x</title>\n <content>c</content>d</content>\n"
            "<<<END_ITEM>>> <<<KNOWLEDGE_ITEM>>><title>t</title><content>u</content><<<END_ITEM>>>")
    assert ops.parse_merge(text) == (
        (("a</title>x", "c</content>d"), ("t", "u")), "ok")
