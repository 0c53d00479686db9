"""The shell commands the README shows, read from its fenced bash blocks.

Used by `.ci/run` (which runs the Quickstart's commands verbatim) and by tests/test_readme.py
(which checks that every other command parses or runs). Standard library only: CI calls it
before any virtual environment exists.

    python3.11 tests/readme_commands.py quickstart 1     # print the first Quickstart command
"""

from __future__ import annotations

import os
import re
import sys

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
_BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.M | re.S)


def sections(text: str) -> dict[str, str]:
    """Level-2 sections of a markdown text by lower-cased title."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip().lower(): body for title, body in zip(parts[1::2], parts[2::2])}


def commands(block: str) -> list[str]:
    """The commands of one bash block: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"[ \t]*\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def section_commands(section: str, text: str | None = None) -> list[str]:
    """Every command of every bash block in the README section titled `section`."""
    if text is None:
        with open(README, encoding="utf-8") as f:
            text = f.read()
    body = sections(text).get(section.lower())
    if body is None:
        raise KeyError(f"README has no section '## {section}'")
    return [c for block in _BLOCK.findall(body) for c in commands(block)]


def all_commands(text: str | None = None) -> list[str]:
    if text is None:
        with open(README, encoding="utf-8") as f:
            text = f.read()
    return [c for block in _BLOCK.findall(text) for c in commands(block)]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    found = section_commands(sys.argv[1])
    index = int(sys.argv[2])
    if not 1 <= index <= len(found):
        sys.exit(f"README section {sys.argv[1]!r} has {len(found)} command(s), not {index}")
    print(found[index - 1])
