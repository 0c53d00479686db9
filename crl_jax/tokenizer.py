"""Tokenizers: local Hugging Face tokenizers, ChatML chat encoding with assistant masks, word-level
vocabularies.

Owns the host-side text <-> token-id boundary:
- `Tokenizer`: a `tokenizers.Tokenizer` plus its special tokens and chat format, loaded from a local
  HF folder (never a hub) and saved back as a standard `tokenizer.json` + `tokenizer_config.json`.
- `ChatML`: the chat format of Qwen2.5 and SmolLM2, rendered here rather than through a jinja
  template, so a folder without a template still works and rendering cannot drift.
- `encode_chat`: a conversation -> token ids [T] plus a mask [T] of the assistant's tokens (its
  content and end-of-turn token). It is built turn by turn from exact token ids; an assistant turn
  may carry the ids it was sampled as (`token_ids`), which are used verbatim.
- `build_word_tokenizer`: a small lossless word-level tokenizer from an environment's texts, for
  the tiny models; method tags such as `<answer>` are single tokens.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from crl_jax.assets import REDOWNLOAD, BadModelFile, named_if_unusable, read_json

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Tags the method's prompts use; single tokens in the word-level tokenizer.
METHOD_TAGS = ("<think>", "</think>", "<answer>", "</answer>",
               "<knowledge_search_and_ask>", "</knowledge_search_and_ask>")
ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class ChatML:
    """`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message; an optional default system turn."""

    default_system: str | None = None

    def messages(self, messages: Sequence[Mapping]) -> list[Mapping]:
        _check_messages(messages)
        if self.default_system is not None and (not messages or messages[0]["role"] != "system"):
            return [{"role": "system", "content": self.default_system}, *messages]
        return list(messages)

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> str:
        text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in self.messages(messages))
        return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")

    def jinja(self) -> str:
        """An equivalent jinja template, for tokenizer_config.json (transformers' apply_chat_template)."""
        default = ""
        if self.default_system is not None:
            literal = json.dumps(f"{IM_START}system\n{self.default_system}{IM_END}\n")
            default = ("{% if loop.first and messages[0]['role'] != 'system' %}{{ " + literal
                       + " }}{% endif %}")
        return ("{% for message in messages %}" + default
                + "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                + "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _check_messages(messages) -> None:
    for i, m in enumerate(messages):
        if (not isinstance(m, Mapping) or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', got {m!r}")


_DEFAULT_SYSTEM_RE = re.compile(r"<\|im_start\|>system(?:\\n|\n)(.*?)<\|im_end\|>", re.S)


def chat_format_from_jinja(template: str | None) -> ChatML | None:
    """Recognise a ChatML jinja template (Qwen2.5, SmolLM2) and its default system prompt."""
    if not template or IM_START not in template:
        return None
    for match in _DEFAULT_SYSTEM_RE.finditer(template):
        text = match.group(1)
        if not any(c in text for c in "'\"{}+"):  # a literal prompt, not `' + message['content'] + '`
            return ChatML(default_system=text.replace("\\n", "\n"))
    return ChatML()


@dataclasses.dataclass(frozen=True)
class ChatEncoding:
    ids: np.ndarray             # [T] int32
    assistant_mask: np.ndarray  # [T] bool: True on the assistant's content and end-of-turn tokens


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


class Tokenizer:
    """A `tokenizers.Tokenizer` with its special tokens and chat format."""

    def __init__(self, backend: tokenizers.Tokenizer, *, eos_token: str, pad_token: str | None = None,
                 bos_token: str | None = None, unk_token: str | None = None,
                 chat: ChatML | None = None, chat_template: str | None = None,
                 extra_stop_ids: Iterable[int] = ()):
        self.backend = backend
        self.eos_token, self.pad_token = eos_token, pad_token
        self.bos_token, self.unk_token = bos_token, unk_token
        self.chat = chat
        self.chat_template = chat_template if chat_template is not None else (chat.jinja() if chat else None)
        self.eos_id = self.token_id(eos_token)
        self.pad_id = self.token_id(pad_token) if pad_token is not None else self.eos_id
        stops = [self.eos_id, *extra_stop_ids]
        if chat is not None:
            stops.append(self.token_id(IM_END))
        self.stop_ids = tuple(dict.fromkeys(int(i) for i in stops))

    # -- loading and saving -------------------------------------------------------------------
    @classmethod
    def load(cls, path, chat: ChatML | None = None) -> "Tokenizer":
        """Load a local HF tokenizer folder (tokenizer.json, or anything AutoTokenizer can convert).
        Files that cannot be used raise BadModelFile naming them."""
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"tokenizer folder not found: {folder}")
        with named_if_unusable(folder):
            return cls._load(folder, chat)

    @classmethod
    def _load(cls, folder: Path, chat: ChatML | None) -> "Tokenizer":
        config = _read_json(folder / "tokenizer_config.json")
        if (folder / "tokenizer.json").is_file():
            try:
                backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as err:  # the tokenizers library raises a bare Exception
                raise BadModelFile(f"{folder / 'tokenizer.json'}: unreadable ({str(err)[:120]}); "
                                   f"{REDOWNLOAD}") from None
        else:
            backend = _backend_via_transformers(folder)
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        generation_eos = _read_json(folder / "generation_config.json").get("eos_token_id") or []
        eos = _token_text(config.get("eos_token"))
        if eos is None:
            raise BadModelFile(f"{folder / 'tokenizer_config.json'}: names no eos_token; {REDOWNLOAD}")
        return cls(backend, eos_token=eos, pad_token=_token_text(config.get("pad_token")),
                   bos_token=_token_text(config.get("bos_token")),
                   unk_token=_token_text(config.get("unk_token")),
                   chat=chat or chat_format_from_jinja(template), chat_template=template,
                   extra_stop_ids=generation_eos if isinstance(generation_eos, list) else [generation_eos])

    def save(self, path) -> Path:
        """Write tokenizer.json + tokenizer_config.json that transformers' AutoTokenizer loads."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                  "eos_token": self.eos_token}
        for name in ("pad_token", "bos_token", "unk_token"):
            if getattr(self, name) is not None:
                config[name] = getattr(self, name)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
        return folder

    # -- plain text -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def fingerprint(self) -> str:
        """A short digest of the whole tokenizer (model, vocabulary, pre-tokenizer): equal
        fingerprints encode every text alike, so a cache built on token ids can key on it."""
        return hashlib.sha256(self.backend.to_str().encode()).hexdigest()[:16]

    def token_id(self, token: str) -> int:
        index = self.backend.token_to_id(token)
        if index is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return index

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without BOS/EOS; special-token text such as `<|im_end|>` maps to its id."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a string, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stop_sequences(self, strings: Iterable[str]) -> tuple[tuple[int, ...], ...]:
        """Token sequences that spell each stop string, for the sampler's stop check.

        A BPE vocabulary spells a string differently after a space (`Ġ</` vs `</`), so both
        spellings are returned when they differ; a single-token tag has one.
        """
        out = []
        for s in strings:
            if not s:
                raise ValueError("empty stop string")
            out.append(tuple(self.encode(s)))
            spaced = tuple(self.encode(" " + s))
            if spaced != tuple(self.encode(" ")) + out[-1]:
                out.append(spaced)
        return tuple(dict.fromkeys(out))

    # -- chat --------------------------------------------------------------------------------
    def _require_chat(self) -> ChatML:
        if self.chat is None:
            raise ValueError("this tokenizer has no ChatML chat template; pass chat=ChatML(...) to load()")
        return self.chat

    def render_chat(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> str:
        return self._require_chat().render(messages, add_generation_prompt)

    def encode_turn(self, message: Mapping) -> tuple[list[int], list[bool]]:
        """(ids, assistant mask) of one ChatML turn, including its trailing newline."""
        _check_messages([message])
        start, end = self.token_id(IM_START), self.token_id(IM_END)
        role, newline = message["role"], self.encode("\n")
        if role != "assistant":
            ids = [start, *self.encode(f"{role}\n{message['content']}"), end, *newline]
            return ids, [False] * len(ids)
        header = [start, *self.encode("assistant\n")]
        sampled = message.get("token_ids")
        content = [int(i) for i in (self.encode(message["content"]) if sampled is None else sampled)]
        if not content or content[-1] != end:
            content.append(end)
        mask = [False] * len(header) + [True] * len(content) + [False] * len(newline)
        return header + content + newline, mask

    def generation_prompt(self) -> list[int]:
        return [self.token_id(IM_START), *self.encode("assistant\n")]

    def encode_chat(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> ChatEncoding:
        """Token ids and assistant mask of a conversation, built turn by turn from exact ids."""
        ids, mask = [], []
        for message in self._require_chat().messages(messages):
            turn_ids, turn_mask = self.encode_turn(message)
            ids += turn_ids
            mask += turn_mask
        if add_generation_prompt:
            prompt = self.generation_prompt()
            ids += prompt
            mask += [False] * len(prompt)
        return ChatEncoding(np.asarray(ids, np.int32), np.asarray(mask, bool))


def _read_json(path: Path) -> dict:
    return read_json(path) if path.is_file() else {}


def _backend_via_transformers(folder: Path) -> tokenizers.Tokenizer:
    import transformers

    try:
        fast = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:  # transformers' own message says which file is missing
        raise FileNotFoundError(
            f"{folder} holds no tokenizer.json and transformers cannot load it: {err}") from err
    if not getattr(fast, "is_fast", False):
        raise ValueError(f"{folder}: only tokenizers with a fast (tokenizers) backend are supported")
    return fast.backend_tokenizer


# A run of two or more spaces, an ASCII word (letters only) or one digit, with at most one leading
# space, one other character with at most one leading space, or one whitespace character: every
# character lands in exactly one piece, so decoding (concatenation) is lossless. Space runs are one
# piece so that a text map row such as "    ..   " costs a few tokens, not one per blank, while its
# columns stay exact (each run length up to MAX_SPACE_RUN is its own token; longer runs split).
# Map cells are single characters ("_X_O" is four pieces), and every single printable ASCII
# character is always in the vocabulary. A word outside the vocabulary (a product code, a name no
# vocabulary text held, a row of monsters "dd") is spelled out in the longest known pieces, down to
# single characters, so that the models can read and copy it: only a character outside ASCII
# becomes <unk>.
MAX_SPACE_RUN = 16
_WORD_PIECES = r" {2,%d}| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s" % MAX_SPACE_RUN
_ALWAYS = [c for c in map(chr, range(33, 127))]
WORD_SPECIALS = ("<pad>", "<unk>", IM_START, IM_END)
# WordPiece maps longer words to <unk> whole; no text here has a word near this long.
_MAX_WORD_CHARS = 1000


def _word_pre_tokenizer():
    return pre_tokenizers.Split(Regex(_WORD_PIECES), behavior="isolated")


def build_word_tokenizer(texts: Iterable[str], *, tags: Sequence[str] = METHOD_TAGS, min_count: int = 1,
                         max_size: int | None = None) -> Tokenizer:
    """A word-level ChatML tokenizer whose vocabulary is the pieces of `texts`.

    Ids: the specials (<pad>=0, <unk>=1, <|im_start|>, <|im_end|> = eos), the tags, the ChatML
    roles and whitespace, then pieces by falling frequency (ties: first seen), each followed by
    its twin with or without a leading space. Pieces seen fewer than `min_count` times, or past
    `max_size` entries, are not entries; like any unseen word, they are spelled out in the
    longest entries that cover them (greedily from the left, as WordPiece does without a
    continuation prefix).
    """
    fixed = [*WORD_SPECIALS, *tags]
    if len(set(fixed)) != len(fixed):
        raise ValueError(f"duplicate special tokens or tags: {fixed}")
    split_specials = re.compile("|".join(re.escape(t) for t in sorted(fixed, key=len, reverse=True)))
    pre = _word_pre_tokenizer()
    counts: Counter = Counter()
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"build_word_tokenizer expects strings, got {type(text).__name__}")
        for segment in split_specials.split(text):
            counts.update(piece for piece, _ in pre.pre_tokenize_str(segment))
    base = [*fixed, *ROLES, " ", "\n", *(" " * n for n in range(2, MAX_SPACE_RUN + 1)),
            *_ALWAYS, *(" " + c for c in _ALWAYS)]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(base))}
    for piece, count in counts.most_common():  # most_common keeps first-seen order among ties
        if count < min_count:
            break
        # A word seen only mid-sentence (" north") also gets its sentence-initial twin ("north").
        twin = piece[1:] if piece.startswith(" ") else " " + piece
        for tok in (piece, twin) if piece.strip() else (piece,):
            if tok not in vocab and (max_size is None or len(vocab) < max_size):
                vocab[tok] = len(vocab)
    # WordPiece with no continuation prefix: a known piece is one token, as in a word-level
    # model; an unknown one falls back to its longest known prefixes instead of <unk>.
    backend = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>",
                                                    continuing_subword_prefix="",
                                                    max_input_chars_per_word=_MAX_WORD_CHARS))
    backend.pre_tokenizer = _word_pre_tokenizer()
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in WORD_SPECIALS])
    # Tags are whole tokens but not "special": decoding with skip_special_tokens keeps them.
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    return Tokenizer(backend, eos_token=IM_END, pad_token="<pad>", unk_token="<unk>", chat=ChatML())
