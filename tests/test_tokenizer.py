"""Tokenizer: ChatML rendering against transformers' jinja templates, assistant masks, word-level vocabularies."""
import json

import numpy as np
import pytest
import tokenizers

from crl_jax.tokenizer import (IM_END, IM_START, METHOD_TAGS, ChatML, Tokenizer, build_word_tokenizer,
                               chat_format_from_jinja)

transformers = pytest.importorskip("transformers")

# SmolLM2-135M-Instruct's template, as its GGUF metadata carries it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Qwen2.5-Instruct's template, its no-tools branch (escaped newlines, whitespace control).
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

CONVERSATIONS = [
    [{"role": "user", "content": "Go north."}],
    [{"role": "system", "content": "You play a text game."},
     {"role": "user", "content": "You see a door. What now?"},
     {"role": "assistant", "content": "<think>The door is north.</think> <answer>north</answer>"},
     {"role": "user", "content": "The door is locked.\n\nWhat now?"},
     {"role": "assistant", "content": "<knowledge_search_and_ask>locked door</knowledge_search_and_ask>"}],
]
CORPUS = [m["content"] for c in CONVERSATIONS for m in c] + [
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."]


@pytest.fixture(scope="module")
def word_tok():
    return build_word_tokenizer(CORPUS)


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    """A small byte-level BPE (the Qwen/SmolLM kind) with ChatML specials, trained here."""
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", IM_START, IM_END],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS * 3, trainer)
    folder = tmp_path_factory.mktemp("bpe")
    Tokenizer(backend, eos_token=IM_END, pad_token="<|endoftext|>", chat=ChatML(),
              chat_template=QWEN25_TEMPLATE).save(folder)
    return folder


def _hf_ids(hf, conversation, generation_prompt):
    out = hf.apply_chat_template(conversation, tokenize=True, add_generation_prompt=generation_prompt)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("template, default_system", [
    (SMOLLM2_TEMPLATE, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    (QWEN25_TEMPLATE, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    (ChatML().jinja(), None),
    (ChatML("Be brief.\nAnswer in <answer></answer>.").jinja(), "Be brief.\nAnswer in <answer></answer>."),
])
def test_chatml_matches_transformers_apply_chat_template(template, default_system, word_tok, tmp_path):
    assert chat_format_from_jinja(template) == ChatML(default_system)
    Tokenizer(word_tok.backend, eos_token=IM_END, pad_token="<pad>", chat=ChatML(),
              chat_template=template).save(tmp_path)
    ours = Tokenizer.load(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours.chat == ChatML(default_system)
    for conversation in CONVERSATIONS:
        for generation_prompt in (False, True):
            text = hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=generation_prompt)
            assert ours.render_chat(conversation, generation_prompt) == text
            encoded = ours.encode_chat(conversation, generation_prompt)
            assert encoded.ids.tolist() == _hf_ids(hf, conversation, generation_prompt)


def test_bpe_chat_encoding_matches_transformers(bpe_folder):
    ours, hf = Tokenizer.load(bpe_folder), transformers.AutoTokenizer.from_pretrained(str(bpe_folder))
    assert ours.chat.default_system.startswith("You are Qwen")
    for conversation in CONVERSATIONS:
        assert ours.encode_chat(conversation, True).ids.tolist() == _hf_ids(hf, conversation, True)
        assert ours.encode_chat(conversation).ids.tolist() == _hf_ids(hf, conversation, False)


def _segments(mask):
    """[start, end) runs of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


@pytest.mark.parametrize("which", ["word", "bpe"])
def test_assistant_mask_is_exactly_assistant_content_and_end(which, word_tok, bpe_folder):
    tok = word_tok if which == "word" else Tokenizer.load(bpe_folder)
    conversation = CONVERSATIONS[1]
    enc = tok.encode_chat(conversation)
    end = tok.token_id(IM_END)
    replies = [m["content"] for m in conversation if m["role"] == "assistant"]
    runs = _segments(enc.assistant_mask)
    assert len(runs) == len(replies)
    for (a, b), reply in zip(runs, replies):
        assert enc.ids[a:b].tolist() == tok.encode(reply) + [end]
        # The header before the run is the assistant's, and a newline (not the model's) follows it.
        assert enc.ids[a - 1 - len(tok.encode("assistant\n")):a].tolist() == tok.generation_prompt()
        assert enc.ids[b:b + 1].tolist() == tok.encode("\n")
    assert enc.ids.dtype == np.int32 and enc.assistant_mask.shape == enc.ids.shape
    # The whole conversation is never masked where a user or system turn is.
    prompt_len = len(tok.encode_chat(conversation[:2], add_generation_prompt=True).ids)
    assert not enc.assistant_mask[:prompt_len].any()


def test_sampled_token_ids_are_used_verbatim(word_tok):
    """An assistant turn carrying the ids it was sampled as is not re-tokenised from its text."""
    sampled = [word_tok.token_id(t) for t in ("<answer>", "north", " north", "</answer>", IM_END)]
    conversation = [{"role": "user", "content": "Go north."},
                    {"role": "assistant", "content": "ignored text", "token_ids": np.asarray(sampled)}]
    enc = word_tok.encode_chat(conversation)
    assert enc.ids[enc.assistant_mask].tolist() == sampled  # no second end token appended
    prefix = word_tok.encode_chat(conversation[:1], add_generation_prompt=True).ids.tolist()
    assert enc.ids.tolist() == prefix + sampled + word_tok.encode("\n")


def test_word_tokenizer_round_trip_and_special_tokens(word_tok):
    text = "You see a door.  What now?\n\n<answer>north</answer><|im_end|>"
    ids = word_tok.encode(text)
    assert word_tok.decode(ids) == text
    assert "<unk>" not in word_tok.decode(ids)
    for tag in (*METHOD_TAGS, IM_START, IM_END, "<pad>", "<unk>"):
        assert len(word_tok.encode(tag)) == 1, tag
    assert (word_tok.token_id("<pad>"), word_tok.token_id("<unk>")) == (0, 1)
    assert word_tok.eos_id == word_tok.token_id(IM_END) and word_tok.pad_id == 0
    # An unseen word is spelled out in known pieces (down to characters): readable and copyable.
    zebra = word_tok.encode("Go zebra b07xq9k")
    assert word_tok.decode(zebra) == "Go zebra b07xq9k" and word_tok.token_id("<unk>") not in zebra
    assert [word_tok.decode([i]) for i in word_tok.encode(" zebra")] == [" z", "e", "b", "r", "a"]
    # Space runs are single tokens of exact length, so text maps keep their columns.
    row = "    ..   " + " " * 20 + "."
    assert word_tok.decode(word_tok.encode(row)) == row and len(word_tok.encode(row)) == 6
    # Tags survive skip_special_tokens (answer parsing needs them); ChatML markers do not.
    assert word_tok.decode(word_tok.encode(f"{IM_START}<answer>north</answer>{IM_END}"),
                           skip_special_tokens=True) == "<answer>north</answer>"
    assert build_word_tokenizer(CORPUS).backend.get_vocab() == word_tok.backend.get_vocab()  # deterministic


def test_word_tokenizer_limits():
    small = build_word_tokenizer(["aa aa aa bb bb cc"], min_count=2)
    assert small.encode("aa bb cc") == small.encode("aa bb") + small.encode(" c") + small.encode("c")
    base = build_word_tokenizer([""]).vocab_size  # specials, tags, roles, whitespace runs
    capped = build_word_tokenizer(["xx yy zz ww vv"] * 3, max_size=base + 3)
    assert capped.vocab_size == base + 3
    assert [capped.decode([i]) for i in capped.encode("xx yy zz")] == ["xx", " yy", " z", "z"]
    # Single ASCII characters are always known, so only characters outside ASCII become <unk>.
    assert "<unk>" not in capped.decode(capped.encode("_X_O @dd 1234 $9.50"))
    assert capped.decode(capped.encode("xx café")) == "xx caf<unk>"  # a character outside ASCII


def test_word_tokenizer_loads_in_tokenizers_and_transformers(word_tok, tmp_path):
    word_tok.save(tmp_path)
    text = "<|im_start|>user\nYou see a door.<|im_end|>\n<think>north</think> <answer>north</answer>"
    raw = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    ids = word_tok.encode(text)
    assert raw.encode(text, add_special_tokens=False).ids == ids
    assert hf(text, add_special_tokens=False)["input_ids"] == ids
    assert fast(text, add_special_tokens=False)["input_ids"] == ids
    assert hf.decode(ids) == text
    assert (hf.eos_token, hf.pad_token, hf.unk_token) == (IM_END, "<pad>", "<unk>")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert chat_format_from_jinja(config["chat_template"]) == ChatML()
    reloaded = Tokenizer.load(tmp_path)
    assert reloaded.encode(text) == ids and reloaded.stop_ids == word_tok.stop_ids


def test_stop_sequences(word_tok, bpe_folder):
    assert word_tok.stop_sequences(["</answer>", IM_END]) == (
        (word_tok.token_id("</answer>"),), (word_tok.eos_id,))
    bpe = Tokenizer.load(bpe_folder)
    assert bpe.stop_ids == (bpe.token_id(IM_END),)
    # Instruct checkpoints list several end ids in generation_config.json (Qwen2.5: <|im_end|>, <|endoftext|>).
    (bpe_folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Tokenizer.load(bpe_folder).stop_ids == (2, 0)
    (bpe_folder / "generation_config.json").unlink()
    sequences = bpe.stop_sequences(["</answer>"])
    assert tuple(bpe.encode("</answer>")) in sequences
    for seq in sequences:  # every spelling decodes back to the stop string
        assert bpe.decode(seq).strip() == "</answer>"
    assert IM_END in bpe.decode(bpe.stop_ids)


def test_clear_errors(word_tok, tmp_path):
    with pytest.raises(ValueError, match="message 0"):
        word_tok.encode_chat([{"role": "user"}])
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing")
    with pytest.raises(KeyError, match="zebra"):
        word_tok.token_id("zebra")
    plain = Tokenizer(word_tok.backend, eos_token=IM_END)
    with pytest.raises(ValueError, match="no ChatML"):
        plain.encode_chat(CONVERSATIONS[0])
