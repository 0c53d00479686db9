"""Warm-start data: scripted episodes for the actor, scripted summaries for the extractor.

`collect_demos` plays train-split tasks with each environment's scripted expert, degraded per
episode by an epsilon of random actions (the mix of `epsilons`), so the cloned policy is decent
but imperfect and RL has room to improve it. The transcripts are chat messages in exactly the
shape the actor loop produces (system prompt with the search tool text and an injected lesson
for guided episodes, goal and first observation, then action / observation turns), so behaviour
cloning trains the actor on the token sequences it will later see and write. Some guided episodes
open with a search-and-ask call answered by the scripted summariser's guidance.

`actor_examples` and `extractor_examples` turn the demos into (ids, trained-token mask) pairs;
the extractor's prompts are built and cut exactly as `rollout.extractor.ExtractorClient` builds
them, and its targets come from `warm_start.lessons`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from crl_jax import envs
from crl_jax.envs.experts import expert_for, random_agent_for
from crl_jax.memory import prompts
from crl_jax.memory.text_store import render_entry
from crl_jax.rollout.actor import first_user_message
from crl_jax.rollout.extractor import prompt_ids
from crl_jax.tokenizer import Tokenizer
from crl_jax.warm_start import lessons


@dataclasses.dataclass
class Demo:
    task: str
    seed: int
    epsilon: float                          # probability of a random action at each turn
    messages: list[dict]
    facts: lessons.EpisodeFacts
    entry: tuple[str, str] | None = None    # (title, content) injected into the system prompt
    searched: bool = False                  # opens with a search-and-ask call
    # The action each assistant turn took, as the environment read it (None: invalid). Differs
    # from the turn's text where an answer is a number (numbered actions).
    actions: list[str | None] = dataclasses.field(default_factory=list)
    final_observation: str = ""             # the answer to the last action (the extractor reads it)


def render(entry: tuple[str, str]) -> str:
    return render_entry(*entry)


def lesson_chunks(tasks: Sequence[str], n: int, most: int,
                  rng: np.random.Generator) -> list[list[tuple[str, str]]]:
    """`n` chunks of 2 to `most` lessons, each of one family of `tasks` (drawn with repeats, so
    some chunks hold duplicates to merge): what merge examples and the merge probe show."""
    if most < 2:
        raise ValueError(f"a merge chunk needs >= 2 lessons; got at most {most}")
    chunks = []
    for _ in range(n if tasks else 0):
        options = lessons.all_lessons(tasks[int(rng.integers(len(tasks)))])
        size = int(rng.integers(2, most + 1))
        chunks.append([options[int(i)] for i in rng.integers(len(options), size=size)])
    return chunks


def play_demo(env, task: str, seed: int, epsilon: float, rng: np.random.Generator, *, max_turns: int,
              entry: tuple[str, str] | None, tools: bool, search: bool) -> Demo:
    """One scripted episode as the actor loop would record it."""
    observation, info = env.reset(seed)
    expert, random_agent = expert_for(env), random_agent_for(env, seed=seed)
    expert.reset(env, observation, info)
    if entry is not None and hasattr(expert, "advise"):  # an expert that acts on the lesson shown
        expert.advise(entry[1])
    random_agent.reset(env, observation, info)
    system = env.system_prompt + ("\n\n" + prompts.SEARCH_TOOL_TEXT if tools else "")
    if entry is not None:
        system = prompts.inject_experience(system, render(entry))
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": first_user_message(info.get("goal", ""), observation)}]
    turns = max_turns or env.max_turns
    if search and entry is not None:  # a tool call uses a turn, as in the actor loop
        messages += [{"role": "assistant",
                      "content": f"{prompts.SEARCH_OPEN}{lessons.QUESTION}{prompts.SEARCH_CLOSE}"},
                     {"role": "user",
                      "content": prompts.search_result_text(lessons.refine_reply(entry[1]))}]
        turns -= 1
    taken: list[str | None] = []
    success, invalid = False, 0
    for _ in range(turns):
        action = expert.act(observation, info)
        if rng.random() < epsilon:
            action = random_agent.act(observation, info)
        messages.append({"role": "assistant", "content": action})
        observation, _, terminated, truncated, info = env.step(action)
        taken.append(info.get("action"))
        success = bool(info.get("success", False))
        invalid = int(info.get("invalid_actions", invalid))
        if terminated or truncated:
            break
        messages.append({"role": "user", "content": observation})
    # The actor loop never trains on (or shows) the answer to the last action; the extractor reads it.
    final = messages.pop()["content"] if messages[-1]["role"] == "user" else observation
    facts = lessons.EpisodeFacts(task, success, len(taken), invalid, max_turns or env.max_turns,
                                 tuple(info.get("facts", ())))
    return Demo(task, seed, epsilon, messages, facts, entry, search and entry is not None, taken, final)


def collect_demos(tasks: Sequence[dict], *, max_turns: int, epsilons: Sequence[float],
                  guided_fraction: float, search_fraction: float, tools: bool, seed: int,
                  progress=None) -> list[Demo]:
    """One demo per task spec ({"env", "seed"}), epsilons cycling over the demos.

    Guided demos carry one of their family's lessons in the system prompt: half of them the
    expert's own lesson, played without random actions (the agent follows the advice, so the
    tiny actor learns to act on a useful entry as an instruction-tuned LLM would), the rest a
    lesson drawn at random, played with the usual epsilon.
    """
    pool: dict[str, object] = {}
    out = []
    try:
        for i, task in enumerate(tasks):
            rng = np.random.default_rng([seed, i])
            name = task["env"]
            env = pool.get(name) or pool.setdefault(name, envs.make(name))
            guided = rng.random() < guided_fraction
            options = lessons.all_lessons(name)
            entry = own = None
            if guided:
                own = lessons.expert_lesson(name, env, int(task["seed"]))
                entry = own if rng.random() < 0.5 else options[int(rng.integers(len(options)))]
            followed = entry is not None and entry == own
            epsilon = 0.0 if followed else float(epsilons[i % len(epsilons)])
            out.append(play_demo(env, name, int(task["seed"]), epsilon, rng,
                                 max_turns=max_turns, entry=entry, tools=tools and guided,
                                 search=guided and rng.random() < search_fraction))
            if progress is not None:
                progress(i + 1, len(tasks))
    finally:
        for env in pool.values():
            env.close()
    return out


# ---- token examples --------------------------------------------------------------------------
Example = tuple[np.ndarray, np.ndarray]   # (ids [T] int32, trained mask [T] bool)
# action_windows(goals=...) adds a third array: each token's position in its episode [T] int32.


def actor_examples(tokenizer: Tokenizer, demos: Sequence[Demo]) -> list[Example]:
    """The actor's behaviour-cloning sequences: every assistant turn (and its end marker) trained."""
    out = []
    for demo in demos:
        encoded = tokenizer.encode_chat(demo.messages)
        out.append((encoded.ids, encoded.assistant_mask))
    return out


def trained_spans(mask) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a trained-token mask: one per action (and end marker)."""
    edges = np.diff(np.concatenate([[0], np.asarray(mask, bool).astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def goal_spans(tokenizer: Tokenizer, demos: Sequence[Demo]) -> list[tuple[int, int]]:
    """Where each demo's first user message (its goal and first observation) lies in its actor
    example: [start, end) token offsets (the chat is encoded turn by turn, so prefixes agree)."""
    return [(len(tokenizer.encode_chat(d.messages[:1]).ids), len(tokenizer.encode_chat(d.messages[:2]).ids))
            for d in demos]


def action_windows(examples: Sequence[Example], window: int,
                   goals: Sequence[tuple[int, int]] | None = None, max_len: int | None = None) -> list:
    """One example per trained span (an action and its end marker) of each example: the last
    `window` tokens up to the span's end, with only that span trained.

    Reading the observation right before an action is what a cloned actor must learn first, and
    the model's positions are relative (RoPE), so what it learns on a window holds in the whole
    transcript; a window costs a fraction of the episode's attention, so the warm start affords
    many more of them. A span longer than `window` keeps its last `window` tokens.

    With `goals` (`goal_spans`), each window that starts after its episode's goal message is
    preceded by that message, and the example carries its tokens' positions in the episode
    (ids, mask, positions): the gap between the two pieces keeps its true length, so attending
    from an action back to the goal is learnt at the distance it has in the whole transcript.
    Household actions name the goal's object and receptacle, and shop searches its keywords, but
    their goal is hundreds of tokens before the action (the pages list every available action).
    `max_len` bounds a goal-preceded example's length (the batch length): one that would pass it
    keeps fewer tokens before its action (the batch would otherwise cut the action itself)."""
    if window <= 0:
        raise ValueError(f"window must be > 0, got {window}")
    if max_len is not None and max_len < window:
        raise ValueError(f"max_len {max_len} is shorter than the window {window}")
    if goals is not None and len(goals) != len(examples):
        raise ValueError(f"{len(goals)} goal spans for {len(examples)} examples")
    out = []
    for k, (ids, mask) in enumerate(examples):
        ids, mask = np.asarray(ids, np.int32), np.asarray(mask, bool)
        for start, end in trained_spans(mask):
            first = max(0, end - window)
            goal_start, goal_end = goals[k] if goals is not None else (0, 0)
            reaches_goal = goals is not None and goal_end >= first
            if reaches_goal:  # the window reaches into the goal: one piece from the goal's start
                first = min(first, goal_start)
            if goals is not None and max_len is not None:  # fit max_len by dropping page tokens
                goal_len = 0 if reaches_goal else goal_end - goal_start
                if goal_len + min(end - start, window) > max_len:
                    raise ValueError(f"an action of {end - start} tokens after a goal message of "
                                     f"{goal_len} does not fit max_len={max_len}")
                first = max(first, end - (max_len - goal_len))
            span = np.zeros(end - first, bool)
            span[max(start, first) - first:] = True
            if goals is None:
                out.append((ids[first:end], span))
            elif reaches_goal:
                out.append((ids[first:end], span, np.arange(first, end, dtype=np.int32)))
            else:
                positions = np.concatenate([np.arange(goal_start, goal_end), np.arange(first, end)])
                out.append((np.concatenate([ids[goal_start:goal_end], ids[first:end]]),
                            np.concatenate([np.zeros(goal_end - goal_start, bool), span]),
                            positions.astype(np.int32)))
    return out


def _reply_example(tokenizer: Tokenizer, messages: list[dict], reply: str, room: int) -> Example:
    prompt = prompt_ids(tokenizer, messages, room)
    response = tokenizer.encode(reply) + [tokenizer.eos_id]
    ids = np.asarray(prompt + response, np.int32)
    mask = np.zeros(len(ids), bool)
    mask[len(prompt):] = True
    return ids, mask


def _any_lesson(task: str, rng: np.random.Generator) -> tuple[str, str]:
    options = lessons.all_lessons(task)
    return options[int(rng.integers(len(options)))]


def extractor_examples(tokenizer: Tokenizer, demos: Sequence[Demo], *, room: int, merges: int,
                       seed: int, merge_lessons: int = 4) -> tuple[list[Example], dict[str, int]]:
    """Distillation replies for every demo, refinement replies for the demos that searched, and
    `merges` merge replies over random chunks of 2 to `merge_lessons` of their family's lessons
    (with repeats, so some chunks need merging). `room` is the extractor's prompt budget (cache
    minus new tokens)."""
    out, counts = [], {"distill": 0, "refine": 0, "merge": 0}
    rng = np.random.default_rng([seed, 5])
    for demo in demos:
        # In RL only guided episodes are distilled, each showing the entry it was given (an empty
        # bank only in the first steps), and most of them fail, so most replies are updates. An
        # unguided demo is therefore distilled twice: as it was, and with a lesson of its family
        # shown. Before, with a lesson only in the guided half, 94% of fresh distillations
        # parsed without a lesson and 12% with one (diag/doors), as did 5% of a run's.
        shown = [[demo.entry]] if demo.entry is not None else [[], [_any_lesson(demo.task, rng)]]
        transcript = prompts.distill_transcript(demo.messages, demo.final_observation)
        for retrieved in shown:
            messages = prompts.distill_messages(demo.facts.success, transcript, [render(e) for e in retrieved])
            out.append(_reply_example(tokenizer, messages, lessons.distill_reply(demo.facts, retrieved), room))
            counts["distill"] += 1
        if demo.searched:
            messages = prompts.refine_messages(lessons.QUESTION, render(demo.entry))
            out.append(_reply_example(tokenizer, messages, lessons.refine_reply(demo.entry[1]), room))
            counts["refine"] += 1
    names = sorted({d.task for d in demos})
    for chunk in lesson_chunks(names, merges, merge_lessons, np.random.default_rng([seed, 7])):
        messages = prompts.merge_messages([render(e) for e in chunk])
        out.append(_reply_example(tokenizer, messages, lessons.merge_reply(chunk), room))
        counts["merge"] += 1
    return out, counts
