"""Extractor-output parsing: unit cases, then 10,000 hostile outputs through the manager: no
exception ever, and the bank changes exactly by the well-formed outputs among them."""
import random

import jax
import pytest

from crl_jax.memory import ops
from crl_jax.memory.manager import MemoryConfig, MemoryManager

E = "<title>{}</title><content>{}</content>"


@pytest.mark.parametrize("text,n,reason,kinds", [
    ("<think>add(x)?</think>\n<answer>\nadd(" + E.format("T", "if (a) then [b]") + ")\n</answer> bye",
     0, "ok", ["add"]),
    ('<answer>["update([2, 1], ' + E.format("T", "C") + ')", "add(' + E.format("U", "D") + ')"]</answer>',
     2, "ok", ["update", "add"]),
    ("<answer>return()</answer>", 0, "return", []),
    ("<answer>add(" + E.format("A", "B") + ") return()</answer>", 0, "return_mixed", []),
    ("<answer>add(" + E.format("A", "B") + ") and more</answer>", 0, "unparsable", []),
    ("<answer>update([0], " + E.format("A", "B") + ")</answer>", 2, "bad_index", []),
    ("<answer>update([1, 1], " + E.format("A", "B") + ")</answer>", 2, "duplicate_target", []),
    ("<answer>update([1], " + E.format("A", "B") + ") update([1], " + E.format("C", "D") + ")</answer>",
     2, "duplicate_target", []),
    ("<answer>add(" + E.format(" ", "B") + ")</answer>", 0, "empty_entry", []),
    ("<answer>" + "add(" + E.format("A", "B") + ")" * 1 + ("add(" + E.format("A", "B") + ")") * 3 + "</answer>",
     0, "too_many_ops", []),
    ("no answer at all", 0, "no_answer", []),
    ("<answer>  </answer>", 0, "empty_answer", []),
])
def test_parse_cases(text, n, reason, kinds):
    parsed = ops.parse_operations(text, n)
    assert parsed.reason == reason
    assert [o.kind for o in parsed.ops] == kinds


def test_update_targets_are_zero_based_and_merge_parse():
    parsed = ops.parse_operations("<answer>update([3, 1], " + E.format("T", "C") + ")</answer>", 3)
    assert parsed.ops[0].targets == (2, 0) and parsed.ops[0].title == "T"
    block = "<<<KNOWLEDGE_ITEM>>>\n" + E.format("a", "b") + "\n<<<END_ITEM>>>"
    assert ops.parse_merge(block + "\n" + block) == ((("a", "b"), ("a", "b")), "ok")
    assert ops.parse_merge("<<<RETURN>>>") == ((), "return")
    assert ops.parse_merge(block + "<<<KNOWLEDGE_ITEM>>>no tags<<<END_ITEM>>>")[1] == "unparsable"
    assert ops.parse_merge(block + "<<<KNOWLEDGE_ITEM>>>" + E.format("x", "y"))[1] == "unparsable"


def _valid_ops(rng, n_retrieved):
    words = ["wait", "door", "key (if any)", "[north]", "ĸey", "🔑", "a\nb", "x, y", "'quoted'", "\"dq\""]
    free = list(range(1, n_retrieved + 1))
    rng.shuffle(free)
    out = []
    for _ in range(rng.randint(1, 3)):
        title = " ".join(rng.choices(words, k=2))
        content = " ".join(rng.choices(words, k=rng.randint(1, 8)))
        if free and rng.random() < 0.5:
            idx = [free.pop() for _ in range(rng.randint(1, len(free)))]
            out.append(f"update([{', '.join(map(str, idx))}], " + E.format(title, content) + ")")
        else:
            out.append("add(" + E.format(title, content) + ")")
    return out


def _hostile(rng, n_retrieved):
    """A malformed output; every branch is built so that it cannot parse as operations."""
    good = _valid_ops(rng, n_retrieved)
    kind = rng.randrange(12)
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300))).decode("latin-1")
    if kind == 1:
        return "<answer>" + "\n".join(good) + "</answer>" + "x" * (ops.MAX_INPUT_CHARS + rng.randint(0, 50_000))
    if kind == 2:
        depth = rng.randint(1, 3000)
        return "<answer>" + "[" * depth + "add(" + E.format("a", "b") + ")" + "]" * (depth - 1) + ")" + "</answer>"
    if kind == 3:
        bad = rng.choice([0, -1, -7, n_retrieved + 1, 10 ** 9, "1.5", "a", ""])
        return f"<answer>update([{bad}], " + E.format("t", "c") + ")</answer>"
    if kind == 4:
        return "<answer>" + "\n".join(good * 4)[:] + "\nreturn()" * rng.randint(4, 6) + "</answer>"
    if kind == 5:
        return "<answer>ａｄｄ(" + E.format("ｔ", "ｃ") + ")</answer>"
    if kind == 6:
        return "<answer>" + rng.choice(['{"op": "add", "memory": "m"}', '["add", 1, null]', "[[[]]]",
                                        '{"add": [' * 500, "null", '["return()", 3]']) + "</answer>"
    if kind == 7:
        return "<answer>" + "\n".join(good) + rng.choice([" extra", " add(", " )", " update([1],"]) + "</answer>"
    if kind == 8:
        return "<answer>add(" + E.format(rng.choice(["", "  "]), "c") + ")</answer>"
    if kind == 9:
        return "<answer>" + good[0] + " return()</answer>"
    if kind == 10:
        return rng.choice(["<answer>" + good[0], good[0] + "</answer>", "<answer>add(<title>t</title>)</answer>",
                           "<answer>add(" + E.format("t", "c" * (ops.MAX_CONTENT_CHARS + 5)) + ")</answer>"])
    return rng.choice([None, b"<answer>return()</answer>", 12, ["add"]])


def test_fuzz_10000_outputs(bank_fns, hash_embed):
    rng = random.Random(1234)
    mgr = MemoryManager(MemoryConfig(tasks=("t",), capacity=6, dim=16), bank_fns, hash_embed)
    expected_next_id, n_good = 0, 0
    for i in range(10_000):
        shown = sorted(rng.sample(sorted(mgr.store.ids()), min(len(mgr.store), rng.randint(0, 3))))
        before_ids = mgr.store.ids()
        if rng.random() < 0.1:
            good_ops = _valid_ops(rng, len(shown))
            text = "<think>" + rng.choice(["", "reason <answer>", "add(x)"]) + "</think><answer>" + \
                rng.choice(["\n", ", "]).join(good_ops) + "</answer>"
            reason, ids = mgr.distill("t", f"q{i}", text, shown, i)
            assert reason == "ok", text
            targets = {shown[int(x) - 1] for op in good_ops if op.startswith("update")
                       for x in op[op.index("[") + 1:op.index("]")].split(",")}
            assert len(ids) == len(good_ops) and not (targets & mgr.store.ids())
            assert set(ids) <= mgr.store.ids()
            expected_next_id += len(good_ops)
            n_good += 1
        else:
            reason, ids = mgr.distill("t", f"q{i}", _hostile(rng, len(shown)), shown, i)
            assert reason not in ("ok", "return") and ids == []
            assert mgr.store.ids() == before_ids
    b = jax.device_get(mgr.bank)
    assert int(b.next_id) == expected_next_id, "ids were spent only by well-formed outputs"
    assert set(b.entry_id[b.valid].tolist()) == mgr.store.ids()
    assert sum(mgr.reasons.values()) == 10_000 and mgr.reasons["ok"] == n_good
    assert len([r for r in mgr.reasons if r not in ("ok",)]) >= 8, mgr.reasons
