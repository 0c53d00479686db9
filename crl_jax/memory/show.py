"""`python -m crl_jax.memory.show PATH`: print an experience bank readably, per task, with counts.

PATH is a JSON file written from `MemoryManager.snapshot_json()` or `MemoryManager.state()[1]`,
or a checkpoint folder, searched for such a JSON file (the newest one is used).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap


def _bank_doc(doc, depth: int = 3) -> dict | None:
    """The bank dict in `doc`: `doc` itself, or one nested a few levels down (a checkpoint keeps
    it at host_state["memory"])."""
    if not isinstance(doc, dict):
        return None
    if "entries" in doc or "text_store" in doc:
        return doc
    for value in doc.values() if depth > 0 else ():
        found = _bank_doc(value, depth - 1)
        if found is not None:
            return found
    return None


def _read(path: str) -> dict | None:
    """The bank dict in the JSON file at `path`, None if there is none; OSError if unreadable."""
    with open(path) as f:
        try:
            return _bank_doc(json.load(f))
        except (ValueError, UnicodeDecodeError):
            return None


def _find_json(folder: str) -> str:
    # Checkpoints write their host JSON as `<step>/host/metadata` (Orbax's name, no extension).
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".json") or (name == "metadata" and os.path.basename(root) == "host"):
                path = os.path.join(root, name)
                try:
                    if _read(path) is not None:
                        found.append(path)
                except OSError:
                    continue
    if not found:
        raise FileNotFoundError(f"no experience-bank JSON (with 'entries' or 'text_store') under {folder}")
    return max(found, key=os.path.getmtime)


def load(path: str) -> dict:
    if os.path.isdir(path):
        path = _find_json(path)
    data = _read(path)
    if data is None:
        raise ValueError(f"{path} holds neither 'entries' nor 'text_store'")
    if "entries" not in data:
        data = {"tasks": data.get("tasks", []), "entries": data["text_store"],
                "reasons": data.get("reasons", {})}
    return data


def render(data: dict, width: int = 100, max_chars: int = 600) -> str:
    entries = data["entries"]
    listed = list(data.get("tasks") or [])
    tasks = listed + sorted({e["task"] for e in entries} - set(listed))
    out = []
    for task in tasks:
        mine = sorted((e for e in entries if e["task"] == task), key=lambda e: e["entry_id"])
        # A checkpoint keeps the retrieval counters in the device bank, not in its host JSON:
        # say so rather than report zero retrievals.
        counted = any("retrieval_count" in e for e in mine)
        shown = (f"{sum(e.get('retrieval_count', 0) for e in mine)} retrievals" if counted
                 else "retrieval counts not in this file")
        out.append(f"== task {task}: {len(mine)} entries, {shown} ==")
        for e in mine:
            counts = (f"retrieved {e['retrieval_count']}x, trained {e.get('train_count', 0)}x"
                      if "retrieval_count" in e else "no counters")
            out.append(f"[{e['entry_id']}] step {e['created_step']}, {counts}: {e['title']}")
            body = e["content"] if len(e["content"]) <= max_chars else e["content"][:max_chars] + " ..."
            out.append(textwrap.indent(textwrap.fill(body, width - 4), "    "))
            out.append(textwrap.indent(textwrap.shorten("key: " + e["query"], width - 4), "    "))
    reasons = data.get("reasons") or {}
    if reasons:
        out.append("== extractor outputs by outcome ==")
        out += [f"{k}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="bank JSON file or checkpoint folder")
    parser.add_argument("--task", help="show only this task")
    args = parser.parse_args(argv)
    try:
        data = load(args.path)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.task:
        data = dict(data, tasks=[args.task], entries=[e for e in data["entries"] if e["task"] == args.task])
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
