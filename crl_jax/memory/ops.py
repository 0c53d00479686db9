"""Parsing of extractor outputs into bank operations; nothing here touches the bank.

Distillation output: free reasoning, then one `<answer>...</answer>` block (the last one counts)
holding at most `MAX_OPS` operations, written either bare or as a JSON list of strings:

    add(<title>T</title><content>C</content>)
    update([1, 3], <title>T</title><content>C</content>)     # 1-based "Memory Entry" numbers
    return()

Merge output: `<<<KNOWLEDGE_ITEM>>> <title>T</title><content>C</content> <<<END_ITEM>>>` blocks, or
`<<<RETURN>>>` to keep the chunk as it is.

Parsing is all-or-nothing: anything malformed (unknown text between operations, an index out of
range, too many operations, an empty or oversized entry) turns the whole output into a no-op with
a reason string from `REASONS`, so the manager can count why outputs were dropped. No input,
however hostile, raises.
"""

from __future__ import annotations

import dataclasses
import json
import re

MAX_OPS = 3
MAX_TITLE_CHARS = 200
MAX_CONTENT_CHARS = 6000
MAX_INPUT_CHARS = 65_536   # ~8k tokens, the extractor's generation budget; longer is rejected unread

REASONS = ("ok", "return", "not_text", "too_long_input", "no_answer", "empty_answer",
           "unparsable", "too_many_ops", "return_mixed", "bad_index", "duplicate_target",
           "empty_entry", "entry_too_long", "no_items")


def _entry_pattern(prefix: str) -> str:
    # Bounded lengths keep the regex linear-ish on hostile input (no unbounded `.*?` scans).
    return (rf"\s*[\"']?\s*<title>(?P<{prefix}t>.{{0,{MAX_TITLE_CHARS}}}?)</title>\s*"
            rf"<content>(?P<{prefix}c>.{{0,{MAX_CONTENT_CHARS}}}?)</content>\s*[\"']?\s*")


_OP = re.compile(
    r"(?P<ret>return\s*\(\s*\))"
    r"|(?P<add>add\s*\(" + _entry_pattern("a") + r"\))"
    r"|(?P<upd>update\s*\(\s*\[(?P<idx>[^\[\]]{0,200})\]\s*," + _entry_pattern("u") + r"\))",
    re.DOTALL)
_GLUE = re.compile(r"[\s\[\],\"']*")
_ITEM_START, _ITEM_END = "<<<KNOWLEDGE_ITEM>>>", "<<<END_ITEM>>>"
_INDEX = re.compile(r"\s*(\d{1,6})\s*")
_SPACE = re.compile(r"\s*")


@dataclasses.dataclass(frozen=True)
class Operation:
    kind: str                       # "add" or "update"
    title: str
    content: str
    targets: tuple[int, ...] = ()   # 0-based positions in the retrieved list (update only)


@dataclasses.dataclass(frozen=True)
class Parsed:
    ops: tuple[Operation, ...]      # empty for a no-op, whatever the reason
    reason: str                     # one of REASONS

    @property
    def ok(self) -> bool:
        return self.reason in ("ok", "return")


def _reject(reason: str) -> Parsed:
    return Parsed((), reason)


def _entry(title: str, content: str) -> tuple[str, str] | str:
    title, content = title.strip(), content.strip()
    if not title or not content:
        return "empty_entry"
    if len(title) > MAX_TITLE_CHARS or len(content) > MAX_CONTENT_CHARS:
        return "entry_too_long"
    return title, content


def _parse_ops(body: str, num_retrieved: int) -> Parsed:
    ops: list[Operation] = []
    saw_return = False
    n_ops = pos = 0
    while True:
        # Operations are matched only where the previous one (or glue) ended: at most MAX_OPS + 1
        # anchored attempts, so hostile text cannot make the regex scan it quadratically.
        pos = _GLUE.match(body, pos).end()
        if pos == len(body):
            break
        m = _OP.match(body, pos)
        if m is None:
            return _reject("unparsable")
        pos = m.end()
        n_ops += 1
        if n_ops > MAX_OPS:
            return _reject("too_many_ops")
        if m.group("ret"):
            saw_return = True
            continue
        is_update = m.group("upd") is not None
        tag = "u" if is_update else "a"
        entry = _entry(m.group(tag + "t"), m.group(tag + "c"))
        if isinstance(entry, str):
            return _reject(entry)
        targets: tuple[int, ...] = ()
        if is_update:
            parts = m.group("idx").split(",")
            if not all(_INDEX.fullmatch(part) for part in parts):
                return _reject("bad_index")
            numbers = [int(part) for part in parts]
            if any(not 1 <= i <= num_retrieved for i in numbers):
                return _reject("bad_index")
            if len(set(numbers)) != len(numbers):
                return _reject("duplicate_target")
            targets = tuple(i - 1 for i in numbers)
        ops.append(Operation("update" if is_update else "add", *entry, targets=targets))
    if saw_return and ops:
        return _reject("return_mixed")
    if saw_return:
        return Parsed((), "return")
    if not ops:
        return _reject("empty_answer")
    claimed = [t for op in ops for t in op.targets]
    if len(set(claimed)) != len(claimed):
        return _reject("duplicate_target")
    return Parsed(tuple(ops), "ok")


def parse_operations(text, num_retrieved: int) -> Parsed:
    """Operations of one distillation output; `num_retrieved` entries were shown numbered 1..n."""
    if not isinstance(text, str):
        return _reject("not_text")
    if len(text) > MAX_INPUT_CHARS:
        return _reject("too_long_input")
    body = _last_answer(text)
    if body is None:
        return _reject("no_answer")
    as_json = _json_list(body)
    if as_json is not None:
        body = "\n".join(as_json)
    if not body.strip():
        return _reject("empty_answer")
    try:
        return _parse_ops(body, num_retrieved)
    except (RecursionError, ValueError, OverflowError):   # defensive: never raise on model text
        return _reject("unparsable")


def _last_answer(text: str) -> str | None:
    """Body of the last `<answer>...</answer>` block, found in linear time."""
    lower = text.lower()
    end = lower.rfind("</answer>")
    if end < 0:
        return None
    start = lower.rfind("<answer>", 0, end)
    return None if start < 0 else text[start + len("<answer>"):end]


def _json_list(body: str) -> list[str] | None:
    """The strings of a JSON list of strings, or None when `body` is not one."""
    stripped = body.strip()
    if not stripped.startswith("["):
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _item_fields(block: str) -> tuple[str, str] | None:
    """(title, content) of `<title>T</title> <content>C</content>` with whitespace around, or
    None. The title ends at the first `</title>` followed by `<content>`, the content at the
    last `</content>`, as a regex of lazy groups would read them, but in one pass: such a regex
    backtracks quadratically on a model's repetition loop (`</title><content>b` repeated)."""
    body = block.strip()
    if not body.startswith("<title>") or not body.endswith("</content>"):
        return None
    content_end = len(body) - len("</content>")
    pos = len("<title>")
    while (close := body.find("</title>", pos)) >= 0:
        after = close + len("</title>")
        opening = _SPACE.match(body, after).end()
        if body.startswith("<content>", opening) and opening + len("<content>") <= content_end:
            return body[len("<title>"):close], body[opening + len("<content>"):content_end]
        pos = close + 1
    return None


def parse_merge(text) -> tuple[tuple[tuple[str, str], ...], str]:
    """`((title, content), ...), reason` of one merge output. Reason "return" (keep the chunk),
    "ok", or a rejection; every item must be well formed or none is used."""
    if not isinstance(text, str):
        return (), "not_text"
    if len(text) > MAX_INPUT_CHARS:
        return (), "too_long_input"
    blocks, pos = [], 0
    while (start := text.find(_ITEM_START, pos)) >= 0:
        end = text.find(_ITEM_END, start)
        if end < 0:
            return (), "unparsable"
        blocks.append(text[start + len(_ITEM_START):end])
        pos = end + len(_ITEM_END)
    if not blocks:
        return (), "return" if "<<<RETURN>>>" in text else "no_items"
    items = []
    for block in blocks:
        fields = _item_fields(block)
        if fields is None:
            return (), "unparsable"
        entry = _entry(*fields)
        if isinstance(entry, str):
            return (), entry
        items.append(entry)
    return tuple(items), "ok"
