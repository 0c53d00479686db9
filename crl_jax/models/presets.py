"""Named model configurations: `tiny` for CPU runs and tests, and the published checkpoints.

Full-size presets match the published config.json of each checkpoint, so `jax.eval_shape` of a
preset gives the published parameter count without allocating anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from crl_jax.models.config import DecoderConfig

_DECODER_PRESETS: dict[str, DecoderConfig] = {
    # A few million parameters: the CPU default actor/extractor; vocab is replaced by the size of
    # the word-level tokenizer built from the environment.
    "tiny": DecoderConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
        num_kv_heads=2, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        max_position_embeddings=8192, model_type="qwen2", qkv_bias=True),
    # About a million parameters: the embedded default run's actor and extractor, sized so that a
    # warm start plus RL fits 15 minutes on two CPU cores (tiny costs ~3x more per token there).
    "micro": DecoderConfig(
        vocab_size=1024, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
        num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        max_position_embeddings=8192, model_type="qwen2", qkv_bias=True),
    # Smaller still: end-to-end tests and smoke runs of the whole training loop.
    "nano": DecoderConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        max_position_embeddings=8192, model_type="qwen2", qkv_bias=True),
    "smollm2-135m": DecoderConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
        max_position_embeddings=8192, model_type="llama", bos_token_id=1, eos_token_id=2,
        pad_token_id=2),
    "qwen2.5-0.5b": DecoderConfig(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
        num_kv_heads=2, head_dim=64, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        qkv_bias=True, max_position_embeddings=32768, model_type="qwen2", eos_token_id=151645,
        pad_token_id=151643),
    "qwen2.5-7b": DecoderConfig(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
        num_kv_heads=4, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=False,
        qkv_bias=True, max_position_embeddings=32768, model_type="qwen2", eos_token_id=151645,
        pad_token_id=151643),
    "qwen3-4b": DecoderConfig(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=5000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        qk_norm=True, max_position_embeddings=262144, model_type="qwen3", eos_token_id=151645,
        pad_token_id=151643),
    "qwen3-embedding-0.6b": DecoderConfig(
        vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        qk_norm=True, max_position_embeddings=32768, model_type="qwen3", eos_token_id=151643,
        pad_token_id=151643),
}

def _bert_presets() -> dict:
    # Imported on use: the BERT module is only needed by the embedder.
    from crl_jax.models import bert

    return bert.BERT_PRESETS


def list_presets() -> list[str]:
    return sorted([*_DECODER_PRESETS, *_bert_presets()])


def get_preset(name: str, **overrides: Any):
    """The config named `name` (a DecoderConfig, or a BertConfig for "minilm-l6"), with dataclass
    fields overridden (e.g. dtype="bfloat16")."""
    if name in _DECODER_PRESETS:
        return dataclasses.replace(_DECODER_PRESETS[name], **overrides)
    if name in _bert_presets():
        return dataclasses.replace(_bert_presets()[name], **overrides)
    raise KeyError(f"unknown preset {name!r}; known: {', '.join(list_presets())}")
