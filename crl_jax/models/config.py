"""Configuration of the decoder family (Llama, Qwen2/2.5, Qwen3) and its dtype policy.

One frozen, hashable dataclass describes every supported architecture; the differences between the
families are flags (QKV bias, per-head q/k RMSNorm, tied embeddings, Llama-3 RoPE scaling).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# crl_jax.models.attention.IMPLEMENTATIONS (not imported: that module imports the layers).
ATTENTION_IMPLEMENTATIONS = ("auto", "materialized", "blockwise", "splash", "cudnn")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling (rope_type "llama3") or plain "linear"."""

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shape and numerics of a decoder-only transformer.

    `dtype` is the compute dtype (activations, matmuls, KV cache); `param_dtype` the storage dtype
    of the weights. Norms, softmax and logits are always computed in float32.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 32768
    model_type: str = "llama"  # which transformers architecture save_pretrained writes
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: str = "none"
    # Sum each weight matmul's contraction as dots of this many terms, added in turn (0: one dot).
    # XLA's float32 dots on CPU round about 1.5x more than PyTorch's; with 64, SmolLM2-135M's
    # logits go from 1.3e-4 to 4.5e-5 off a float64 reference (PyTorch float32: 6.0e-5), and its
    # forward takes 1.8x as long. For parity checks on CPU, not for training.
    dot_chunk: int = 0
    # Which attention implementation (crl_jax.models.attention), and its block size where it has one.
    attention: str = "auto"
    attention_block: int = 512
    # Context parallelism for sequences too long for one chip: without a cache, activations are
    # split along T over the mesh axis of the `context` rule (crl_jax/sharding.py) and splash
    # attention gathers keys and values; meant for micro-batches smaller than that axis.
    context_parallel: bool = False
    # Run the MLP over time chunks of this many tokens, each rematerialised (0: whole sequence):
    # for long sequences, whose MLP activations dominate an update once attention is blockwise.
    mlp_chunk: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        problems = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"{name} must be a positive int, got {value!r}")
        if not problems and self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                            f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2 if isinstance(self.head_dim, int) else False:
            problems.append(f"head_dim must be even for RoPE, got {self.head_dim}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                problems.append(f"{name} must be one of {sorted(DTYPES)}, got {getattr(self, name)!r}")
        if self.remat not in REMAT_POLICIES:
            problems.append(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if not isinstance(self.dot_chunk, int) or self.dot_chunk < 0:
            problems.append(f"dot_chunk must be an int >= 0, got {self.dot_chunk!r}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            problems.append(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, got {self.attention!r}")
        if not isinstance(self.attention_block, int) or self.attention_block < 8:
            problems.append(f"attention_block must be an int >= 8, got {self.attention_block!r}")
        if not isinstance(self.mlp_chunk, int) or self.mlp_chunk < 0:
            problems.append(f"mlp_chunk must be an int >= 0, got {self.mlp_chunk!r}")
        elif self.mlp_chunk and self.context_parallel:
            problems.append("mlp_chunk and context_parallel both split the sequence; set one")
        if self.model_type not in ("llama", "qwen2", "qwen3"):
            problems.append(f"model_type must be llama, qwen2 or qwen3, got {self.model_type!r}")
        if problems:
            raise ValueError("invalid DecoderConfig:\n  " + "\n  ".join(problems))

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        return DTYPES[self.param_dtype]

    @property
    def eos_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def replace(self, **changes: Any) -> "DecoderConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count, computed from the shapes alone."""
        d, f, n, k, h = (self.hidden_size, self.intermediate_size, self.num_heads,
                         self.num_kv_heads, self.head_dim)
        attention = d * n * h + 2 * d * k * h + n * h * d
        attention += (n * h + 2 * k * h) if self.qkv_bias else 0
        attention += d if self.o_bias else 0
        attention += 2 * h if self.qk_norm else 0
        layer = attention + 3 * d * f + 2 * d
        embeddings = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.num_layers * layer + embeddings + d
