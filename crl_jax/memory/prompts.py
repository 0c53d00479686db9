"""Prompt text around the experience bank: what the extractor is asked and what the actor is shown.

Four prompts, each returning chat messages (`[{"role", "content"}]`) for the tokenizer's template:
- `distill_messages`: after an episode, outcome + transcript (with the injected experience cut
  out) + the retrieved entries numbered "Memory Entry i" -> operations in `<answer>` (see ops.py);
- `merge_messages`: up to a chunk of entries (the previous chunk's merged items first) ->
  `<<<KNOWLEDGE_ITEM>>>` blocks or `<<<RETURN>>>`;
- `refine_messages`: the actor's search-and-ask query + the entry found -> guidance for it;
- `inject_experience` / `strip_injection`: the actor-side wrapper around a retrieved entry, with
  fixed markers so the distillation transcript can drop it exactly.
The wording is crl_jax's own, following the method description; the formats match ops.py.
"""

from __future__ import annotations

from collections.abc import Sequence

NO_MEMORIES = "[No previous memories]"
SEARCH_OPEN, SEARCH_CLOSE = "<knowledge_search_and_ask>", "</knowledge_search_and_ask>"
_INJECT_BEGIN, _INJECT_END = "\n\n[Experience notes]\n", "\n[End of experience notes]"
ROLE_LABELS = {"system": "System", "user": "Environment", "tool": "Tool Environment",
               "assistant": "Agent"}

DISTILL_SYSTEM = """\
You turn finished episodes of an autonomous agent into reusable lessons for a shared knowledge \
bank. Another agent will read one lesson at the start of a similar task, so a lesson must help \
across many instances of a task family, not just the episode you saw.

Rate how general a candidate lesson is, from 1 (only this exact instance) through 2 (this one \
scenario), 3 (a principle for the task family), 4 (holds across variations of the category) to 5 \
(holds in any domain). Keep only lessons rated 3 or higher.

A good lesson states:
- when it applies, in terms of signals the agent can observe;
- the steps to take, in order;
- explicit if-then decisions, with a fallback when the first plan fails;
- the mistakes to avoid and why they fail;
- nothing instance-specific: no coordinates, names or exact layouts.
Avoid absolute rules ("always", "never") and fixed action scripts unless they truly never vary. \
For exploration, say how to keep track of what was tried, how to notice a loop, and when to \
switch strategy.

Think inside <think></think>, then give your decision inside <answer></answer> as at most 3 \
operations, one per line:
add(<title>short name</title><content>the lesson</content>)
  a new lesson, only when it is truly different from every lesson listed; prefer update.
update([i, j], <title>short name</title><content>the lesson</content>)
  replaces the listed lessons (their Memory Entry numbers) with one corrected, broader or richer \
lesson.
return()
  nothing worth keeping was learned."""

MERGE_SYSTEM = """\
You maintain a bank of lessons written for an autonomous agent. You receive a handful of lessons \
from the same task. Many were written from parallel runs of the same task, so some repeat each \
other, some conflict, and some are tied to one instance.

For the lessons you are given:
- combine lessons that share one underlying principle into a single lesson;
- rewrite over-specific rules as conditions the agent can observe, with fallbacks;
- drop lessons that are wrong, contradict stronger evidence, or only describe one instance;
- if the lessons are already distinct and sound, change nothing.
Each lesson you keep should usually take three sentences or more.

Write every lesson you keep as
<<<KNOWLEDGE_ITEM>>>
<title>short name</title>
<content>the lesson</content>
<<<END_ITEM>>>
Lessons you do not write out are deleted. To keep all of them exactly as they are, answer only \
<<<RETURN>>>."""

REFINE_SYSTEM = """\
An autonomous agent is stuck in the middle of a task and asked for help. You receive its \
question, which describes what it observes, what blocks it and what it already tried, and one \
lesson retrieved from a knowledge bank. Work out the agent's situation, decide which parts of the \
lesson apply to it, check them against what you know about such tasks, and reply with concrete \
guidance the agent can act on now. Reply with the guidance only; do not comment on the lesson."""

INJECTION_TEXT = ("These notes were distilled from earlier attempts at similar tasks. Use what "
                  "fits your current situation and ignore what does not; some notes may be too "
                  "specific or simply wrong, so check them against what you observe.\n{memory}")

SEARCH_TOOL_TEXT = (
    "\nIf you are unsure or stuck, you may consult the knowledge bank by writing a question between "
    f"{SEARCH_OPEN} and {SEARCH_CLOSE}. Make it self-contained: what you observe now, what blocks "
    "you, what you already tried, and exactly what you need to know.")


def _numbered(entries: Sequence[str]) -> str:
    if not entries:
        return NO_MEMORIES
    return "\n\n".join(f"Memory Entry {i}:\n{text}" for i, text in enumerate(entries, 1))


def format_transcript(messages: Sequence[dict]) -> str:
    """Role-labelled transcript; injected experience is cut out of every message."""
    parts = []
    for m in messages:
        label = ROLE_LABELS.get(m["role"], m["role"].capitalize())
        parts.append(f"[{label}]\n{strip_injection(m['content'])}")
    return "\n\n".join(parts)


def distill_transcript(messages: Sequence[dict], final_observation: str) -> list[dict]:
    """The whole episode as the extractor reads it: the actor's transcript and the environment's
    answer to its last action (the actor never sees that one; the extractor needs it, as it
    says what the last action did)."""
    return list(messages) + ([{"role": "user", "content": final_observation}] if final_observation else [])


def distill_messages(success: bool, transcript: Sequence[dict], retrieved: Sequence[str]) -> list[dict]:
    user = (f"## Outcome\n{'SUCCESS' if success else 'FAILURE'}\n\n"
            f"## Interaction\n{format_transcript(transcript)}\n\n"
            f"## Previous Lessons\n{_numbered(retrieved)}")
    return [{"role": "system", "content": DISTILL_SYSTEM}, {"role": "user", "content": user}]


def merge_messages(entries: Sequence[str]) -> list[dict]:
    if not entries:
        raise ValueError("merge_messages needs at least one entry")
    return [{"role": "system", "content": MERGE_SYSTEM},
            {"role": "user", "content": f"## Lessons\n{_numbered(entries)}"}]


def refine_messages(question: str, entry: str) -> list[dict]:
    return [{"role": "system", "content": REFINE_SYSTEM},
            {"role": "user", "content": f"## Agent's question\n{question}\n\n## Retrieved lesson\n{entry}"}]


def inject_experience(system_text: str, entry: str | None) -> str:
    """The actor's system message with `entry` appended; unchanged when nothing was retrieved."""
    if not entry:
        return system_text
    return system_text + _INJECT_BEGIN + INJECTION_TEXT.format(memory=entry) + _INJECT_END


def strip_injection(text: str) -> str:
    """Inverse of `inject_experience`: `text` with every injected block removed."""
    while (start := text.find(_INJECT_BEGIN)) >= 0:
        end = text.find(_INJECT_END, start)
        if end < 0:
            break
        text = text[:start] + text[end + len(_INJECT_END):]
    return text


def search_result_text(guidance: str | None) -> str:
    """The tool message the actor gets back from search-and-ask."""
    return f"Search results: {guidance if guidance else 'nothing relevant was found.'}"
