"""The tiny models' vocabulary: built from a dozen episodes per task plus each environment's word
lists, it must read every word of unseen episodes, and spell out the generated ones (product codes)
so that the actor can copy them."""

import re

import pytest

from crl_jax import envs
from crl_jax.envs.experts import expert_for, random_agent_for
from crl_jax.rollout.vocabulary import build_tokenizer

TASKS = ("shop/v1", "household/v1")
# Product codes ("b07xq9k2mz", shown as "[B07XQ9K2MZ]" on result pages) and the model numbers in
# shop titles ("Model HW7F") are drawn at random: no vocabulary can hold them, so they are the
# words spelled out.
GENERATED = re.compile(r"\b[bB]0[a-zA-Z0-9]{8}\b|Model [A-Z0-9]{4}")
WORD = re.compile(r" ?[A-Za-z]+")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TASKS)


def held_out_texts(name, seeds=range(500, 512)):
    """Observations and actions of expert and random episodes on seeds the vocabulary never saw."""
    env = envs.make(name)
    for agent in (expert_for(env), random_agent_for(env, seed=1)):
        for seed in seeds:
            observation, info = env.reset(seed)
            agent.reset(env, observation, info)
            yield observation
            for _ in range(8):
                action = agent.act(observation, info)
                observation, _, terminated, truncated, info = env.step(action)
                yield action
                yield observation
                if terminated or truncated:
                    break


@pytest.mark.parametrize("name", TASKS)
def test_every_word_of_unseen_episodes_is_one_token(tokenizer, name):
    vocab = tokenizer.backend.get_vocab()
    missing = set()
    for text in held_out_texts(name):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text and tokenizer.token_id("<unk>") not in ids
        missing.update(w for w in WORD.findall(GENERATED.sub("", text)) if w not in vocab)
    assert not missing, f"{name}: words outside the vocabulary: {sorted(missing)[:20]}"


def test_product_codes_are_spelled_out_and_copyable(tokenizer):
    env = envs.make("shop/v1")
    code = env.catalog[-1].asin
    ids = tokenizer.encode(f"click[{code}]")
    pieces = [tokenizer.decode([i]) for i in ids]
    assert "".join(pieces) == f"click[{code}]" and len(pieces) > 4
    # The same code reads as the same ids in a page and in the action that copies it.
    page_ids = tokenizer.encode(f"[{code}]\nSome product")
    assert ids[1:] == page_ids[:len(ids) - 1]


def test_environments_without_word_lists_add_nothing():
    # The room's vocabulary comes from its episodes alone, as before word lists existed.
    assert envs.make("minihack/room-ultimate-lit-5x5").vocabulary_texts() == []
