"""A scripted summariser: the lessons, questions and replies the extractor is warm-started on.

Real extractors start from an instruction-tuned LLM that already writes well-formed bank
operations. The tiny CPU extractor starts from random weights, so its warm start imitates this
module: for a finished episode it writes a distillation reply (`<think>` + `<answer>` with one
`add` / `update` / `return()` operation in ops.py's syntax), for a search-and-ask question a short
guidance reply, and for a merge chunk either `<<<RETURN>>>` or one merged item.

The lessons are general rules per task family (never coordinates or instance details), picked by
what the episode shows: its outcome, whether it was short or long, whether the agent wrote invalid
actions. Which lesson is written is deterministic given the episode, so the warm-start data is
reproducible. `vocabulary_texts()` lists every string this module can produce, so the word-level
tokenizer of the tiny models covers them.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

_GO_STRAIGHT_FOR_THE_STAIRS = (
    "go straight for the stairs",
    "When the You see line shows the staircase, move in the direction it names last, such as "
    "southeast, every turn until you stand on it. Diagonal moves cover two directions in one turn. "
    "Do not explore once the goal is in view.")
_ONE_DIRECTION_WORD = (
    "write one valid action",
    "Answer with exactly one direction word inside the answer tags, such as north or southeast. "
    "Anything else wastes a turn.")

# family -> {situation -> (title, content)}. Situations: "fast" and "slow" successes, "fail"ures,
# and "format" (the agent wrote actions the environment did not accept).
_LESSONS: dict[str, dict[str, tuple[str, str]]] = {
    "minihack": {
        "fast": _GO_STRAIGHT_FOR_THE_STAIRS,
        "slow": ("explore a dark room systematically",
                 "In a dark room you only see the squares next to you. First move diagonally "
                 "toward the middle of the room to uncover more floor, then follow the walls. If "
                 "the same squares keep showing up, you are in a loop: switch to the opposite "
                 "direction. Step onto > as soon as it appears."),
        "fail": ("avoid walking into walls",
                 "If a move leaves the map unchanged, a wall or the edge of the room blocks that "
                 "direction, so try a different one instead of repeating it. Keep track of the "
                 "directions already tried and head toward squares you have not seen yet."),
        "format": _ONE_DIRECTION_WORD,
    },
    # A lit room shows the staircase from the first turn, so there is nothing to explore: every
    # success, quick or not, teaches going straight for it (the dark room's "slow" lesson about
    # exploring would be wrong advice here), and failures come from what blocks the way.
    "minihack-lit": {
        "fast": _GO_STRAIGHT_FOR_THE_STAIRS,
        "fail": ("go around what blocks the way",
                 "If a move leaves the map unchanged, a wall blocks that direction. If the trap ^ "
                 "or a monster stands between you and the staircase, step diagonally around it, "
                 "then move in the direction the You see line names last for the staircase."),
        "format": _ONE_DIRECTION_WORD,
    },
    "sokoban": {
        "fast": ("plan pushes before moving",
                 "Before pushing, check that the square behind the box is free and that the box "
                 "will not end in a corner. Push each box straight to its target when the line "
                 "is clear."),
        "slow": ("keep boxes away from walls",
                 "A box pushed against a wall can only move along that wall, and a box in a "
                 "corner is stuck for good. Walk around a box to push it from the other side "
                 "instead of pushing it into a wall."),
        "fail": ("undo nothing by force",
                 "When no box can move toward a target, the puzzle is likely stuck: stop pushing "
                 "the same box and try the other box first. Count moves so you notice when you "
                 "circle."),
        "format": ("write one valid action",
                   "Answer with exactly one direction word inside the answer tags. Anything else "
                   "wastes a turn."),
    },
    "household": {
        "fast": ("find the object, then act on it",
                 "Go to the place where the object is most likely kept, take it, then go to the "
                 "target and use it there. Check the goal again before the last action."),
        "slow": ("search likely places first",
                 "When the object is not where you look, open the closed containers nearby "
                 "before you move to another room, and do not search the same place twice."),
        "fail": ("read the goal carefully",
                 "If the task did not finish, the object or the target was probably wrong. "
                 "Compare each word of the goal with what you are holding before you place it."),
        "format": ("use the listed actions",
                   "Answer with one of the actions the environment lists, inside the answer tags. "
                   "Other wording is not understood."),
    },
    "shop": {
        "fast": ("search, check, buy",
                 "Search with the main words of the request, open the item that matches most "
                 "of them, choose the requested options, then buy it."),
        "slow": ("refine the search",
                 "If the results do not match the request, search again with fewer and more "
                 "specific words instead of opening every item."),
        "fail": ("match every attribute",
                 "Before you buy, check the price limit and every attribute of the request; an "
                 "item that misses one of them earns little."),
        "format": ("use the listed actions",
                   "Answer with one of the actions the page offers, inside the answer tags."),
    },
    "textworld": {
        "fast": ("follow the recipe in order",
                 "Read the recipe first, collect the ingredients it names, prepare each one as "
                 "it says, then cook the meal and eat it."),
        "slow": ("look before you walk",
                 "Look at the room and the inventory before moving; go through each exit once "
                 "and remember which rooms you have seen."),
        "fail": ("do not skip steps",
                 "If a command fails, the step before it is usually missing: take, open or "
                 "unlock first, then try again."),
        "format": ("use the listed actions",
                   "Answer with one of the admissible commands, inside the answer tags."),
    },
    "generic": {
        "fast": ("act toward the goal",
                 "Read the goal, find the first thing it needs, and act on it directly; check "
                 "the goal again after each step."),
        "slow": ("notice loops",
                 "If the same observation comes back, you are repeating yourself: try an action "
                 "you have not tried yet."),
        "fail": ("change the plan when stuck",
                 "When several actions in a row change nothing, the plan is wrong: go back to "
                 "the goal and pick a different first step."),
        "format": ("write one valid action",
                   "Answer with exactly one valid action inside the answer tags."),
    },
}

_THINK = {
    "fast": "The episode succeeded quickly.",
    "slow": "The episode succeeded but took many actions.",
    "fail": "The episode failed.",
    "format": "The agent wrote invalid actions.",
}

QUESTION = ("I have not reached the goal yet and I do not know where to go next. What should I "
            "do now?")

_GUIDANCE_OPENING = "Apply this now: "

# Families whose lessons are facts copied out of the episode (its `info["facts"]` sentences), not
# general rules: the diagnostic (envs/doors.py), where which fact is useful must be learnt.
FACT_FAMILIES = ("diag",)
FACT_TITLE = "what an earlier episode showed"


def family(task: str) -> str:
    """The lesson family of a task name such as "minihack/room-ultimate-5x5" ("minihack"); lit
    MiniHack rooms ("minihack/room-ultimate-lit-5x5") have their own, "minihack-lit"."""
    head, _, rest = task.partition("/")
    if head == "minihack" and "lit" in rest.split("-"):
        return "minihack-lit"
    return head if head in _LESSONS or head in FACT_FAMILIES else "generic"


@dataclasses.dataclass(frozen=True)
class EpisodeFacts:
    """What the summariser looks at in a finished episode."""

    task: str
    success: bool
    actions: int
    invalid_actions: int
    max_turns: int
    notes: tuple[str, ...] = ()     # the facts the episode showed, in order (fact families)


def situation(facts: EpisodeFacts) -> str:
    if facts.invalid_actions > 0 and not facts.success:
        return "format"
    if not facts.success:
        return "fail"
    return "fast" if facts.actions <= max(2, facts.max_turns // 3) else "slow"


def lesson(facts: EpisodeFacts) -> tuple[str, str]:
    """(title, content) of the lesson the summariser draws from an episode. A family without a
    "slow" lesson teaches its "fast" one for every success. In a fact family it copies one of the
    episode's facts, chosen by a hash of the episode: not always the useful one."""
    if family(facts.task) in FACT_FAMILIES:
        notes = facts.notes or ("nothing was learnt",)
        pick = zlib.crc32("|".join((facts.task, *notes)).encode()) % len(notes)
        return FACT_TITLE, notes[pick]
    lessons = _LESSONS[family(facts.task)]
    return lessons.get(situation(facts), lessons["fast"])


def distill_reply(facts: EpisodeFacts, retrieved: Sequence[tuple[str, str]]) -> str:
    """The distillation reply for an episode given the (title, content) entries it was shown.

    A lesson already shown is kept (return()); a different one is added; when the episode
    failed with a retrieved lesson that differs from the new one, that entry did not help and is
    updated to the new lesson. (Updates replace rather than concatenate, so every reply fits in
    the tiny extractor's generation budget.)
    """
    title, content = lesson(facts)
    think = f"<think>{_THINK[situation(facts)]}</think>"
    if any(content == c for _, c in retrieved):
        return f"{think}<answer>return()</answer>"
    if retrieved and not facts.success:
        return f"{think}<answer>update([1], <title>{title}</title><content>{content}</content>)</answer>"
    return f"{think}<answer>add(<title>{title}</title><content>{content}</content>)</answer>"


def merge_reply(entries: Sequence[tuple[str, str]]) -> str:
    """The merge reply for a chunk of (title, content) entries: keep the chunk when all are
    distinct, else one item per distinct content."""
    contents = [c for _, c in entries]
    if len(set(contents)) == len(contents):
        return "<<<RETURN>>>"
    kept: dict[str, str] = {}
    for title, text in entries:
        kept.setdefault(text, title)
    return "\n".join(f"<<<KNOWLEDGE_ITEM>>>\n<title>{t}</title>\n<content>{c}</content>\n<<<END_ITEM>>>"
                     for c, t in kept.items())


def refine_reply(entry_content: str) -> str:
    """The guidance the scripted summariser gives for a search-and-ask question."""
    return _GUIDANCE_OPENING + entry_content


def all_lessons(task: str) -> list[tuple[str, str]]:
    if family(task) in FACT_FAMILIES:
        from crl_jax import envs

        return [(FACT_TITLE, fact) for fact in envs.make(task).all_facts()]
    return list(_LESSONS[family(task)].values())


def expert_lesson(task: str, env=None, seed: int | None = None) -> tuple[str, str]:
    """The lesson that describes what the scripted expert does (its "fast" lesson): demos that
    carry it are played without random actions, the way an instruction-tuned actor follows advice.
    In a fact family it is the fact that solves episode `seed` of `env` (its expert's advice)."""
    if family(task) in FACT_FAMILIES:
        env.reset(seed)
        return FACT_TITLE, env.solving_fact()
    return _LESSONS[family(task)]["fast"]


def vocabulary_texts(tasks: Sequence[str] = ()) -> list[str]:
    """Every string the summariser can write for `tasks` (a fact family's facts come from its
    environment's own vocabulary texts)."""
    texts = [QUESTION, _GUIDANCE_OPENING, *_THINK.values(),
             "<think></think><answer>return()</answer> update([1], add(<title></title><content></content>)"]
    for lessons in _LESSONS.values():
        for title, content in lessons.values():
            texts += [title, content]
    if any(family(task) in FACT_FAMILIES for task in tasks):
        texts += [FACT_TITLE, "nothing was learnt"]
    return texts
