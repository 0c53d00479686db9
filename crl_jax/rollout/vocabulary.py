"""The word-level vocabulary of the tiny models: every text they will read or write.

The tiny actor and extractor cannot afford a 50k-entry BPE vocabulary, so their tokenizer is built
from the environments' own texts (system prompts, observations and actions of a dozen
scripted-expert and random episodes, and each environment's word lists: catalogue words, object
names that a dozen episodes may miss), the method's prompts (distillation, merge, refinement,
injection, tool text), the extractor's operation syntax and the warm start's scripted lessons.
A word outside it (a product code drawn at random) is spelled out in known pieces, down to single
characters (tokenizer.build_word_tokenizer). The build is deterministic, and the trainer caches
the result in the workdir so a resumed run reads exactly the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from crl_jax import envs
from crl_jax.memory import prompts
from crl_jax.tokenizer import Tokenizer, build_word_tokenizer
from crl_jax.warm_start import lessons

_OPERATION_SYNTAX = (
    'add(title="...", content="...") update([1, 2], title="...", content="...") return() '
    "<<<KNOWLEDGE_ITEM>>> <<<END_ITEM>>> <<<RETURN>>> <title> </title> <content> </content> "
    "[ ] ( ) , . : ; - 0 1 2 3 4 5 6 7 8 9 10 if then else when avoid try first next until stuck")


def _episode_texts(env, seeds: Iterable[int], agent) -> Iterable[str]:
    for seed in seeds:
        observation, info = env.reset(seed)
        yield info.get("goal", "")
        yield observation
        agent.reset(env, observation, info)
        for _ in range(env.max_turns):
            action = agent.act(observation, info)
            yield action
            observation, _, terminated, truncated, info = env.step(action)
            yield observation
            if terminated or truncated:
                break


def collect_texts(task_names: Sequence[str], episodes_per_task: int = 12) -> list[str]:
    texts = [prompts.DISTILL_SYSTEM, prompts.MERGE_SYSTEM, prompts.REFINE_SYSTEM,
             prompts.INJECTION_TEXT, prompts.SEARCH_TOOL_TEXT, prompts.NO_MEMORIES,
             prompts.search_result_text(None), _OPERATION_SYNTAX,
             "## Outcome SUCCESS FAILURE ## Interaction ## Previous Lessons Memory Entry",
             "## Agent's question ## Retrieved lesson ## Lessons Goal: goal: observation:",
             " ".join(prompts.ROLE_LABELS.values()), prompts.inject_experience("", "notes"),
             *lessons.vocabulary_texts(task_names)]
    from crl_jax.envs.experts import expert_for, random_agent_for

    for name in task_names:
        env = envs.make(name)
        texts.append(env.system_prompt)
        texts.extend(env.vocabulary_texts())
        # Random play covers the failure texts, expert play the ones on the way to success.
        texts.extend(_episode_texts(env, range(episodes_per_task), random_agent_for(env, seed=0)))
        try:
            expert = expert_for(env)
        except LookupError:  # environments without a scripted expert
            expert = None
        if expert is not None:
            texts.extend(_episode_texts(env, range(episodes_per_task), expert))
        env.close()
    return texts


def build_tokenizer(task_names: Sequence[str], max_size: int = 4096) -> Tokenizer:
    return build_word_tokenizer(collect_texts(task_names), max_size=max_size)
