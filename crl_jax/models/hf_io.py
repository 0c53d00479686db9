"""Import and export of Hugging Face checkpoint folders (config.json + safetensors).

`from_pretrained(path)` reads a local folder, single-file or sharded (model.safetensors.index.json)
safetensors, and returns a ready `Decoder`; with a mesh, every parameter is created directly as a
sharded array (each device receives only its own shard). `save_pretrained(model, path)` writes a
folder that `transformers` loads back.

HF stores projections as [out, in] matrices; crl_jax keeps them as [in, heads, head_dim] and
[heads, head_dim, out] so sharding can name the head axis. The mapping table below is the only
place that knows both layouts.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from crl_jax import sharding
from crl_jax.assets import REDOWNLOAD, BadModelFile, named_if_unusable, read_json
from crl_jax.models.config import DecoderConfig, RopeScaling
from crl_jax.models.decoder import Decoder, param_logical_axes

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


class CheckpointError(BadModelFile):
    """A checkpoint folder that cannot be loaded; the message names what is wrong."""


# config.json keys without which no decoder config can be built.
REQUIRED_CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads")


# ---- config ---------------------------------------------------------------------------------------
def config_from_hf(hf_config, **overrides) -> DecoderConfig:
    """DecoderConfig from a transformers PretrainedConfig (or a config.json dict)."""
    get = (hf_config.get if isinstance(hf_config, dict)
           else lambda key, default=None: getattr(hf_config, key, default))
    model_type = get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"unsupported architecture model_type={model_type!r}; "
                              f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if get("mlp_bias", False):
        raise CheckpointError("mlp_bias=True is not supported")
    if get("use_sliding_window", False):
        raise CheckpointError("sliding-window attention (use_sliding_window=True) is not supported")
    rope_scaling = None
    scaling = get("rope_scaling") or None
    # transformers >= 5 folds rope_theta into rope_parameters.
    params = get("rope_parameters") or {}
    if isinstance(params, dict) and params.get("rope_type", "default") != "default":
        scaling = params
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type == "llama3":
            rope_scaling = RopeScaling(
                "llama3", float(scaling["factor"]), float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))
        elif rope_type == "linear":
            rope_scaling = RopeScaling("linear", float(scaling["factor"]))
        elif rope_type not in (None, "default"):
            raise CheckpointError(f"unsupported rope scaling {rope_type!r} (llama3, linear)")
    rope_theta = get("rope_theta") or (params.get("rope_theta") if isinstance(params, dict) else None)
    num_heads = get("num_attention_heads")
    head_dim = get("head_dim") or get("hidden_size") // num_heads
    attention_bias = bool(get("attention_bias", False))
    fields = dict(
        vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
        intermediate_size=get("intermediate_size"), num_layers=get("num_hidden_layers"),
        num_heads=num_heads, num_kv_heads=get("num_key_value_heads") or num_heads,
        head_dim=head_dim, rope_theta=float(rope_theta or 10000.0), rope_scaling=rope_scaling,
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type == "llama" and attention_bias,
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(get("max_position_embeddings", 32768)), model_type=model_type,
        bos_token_id=get("bos_token_id"), eos_token_id=_as_ids(get("eos_token_id")),
        pad_token_id=get("pad_token_id"))
    fields.update(overrides)
    return DecoderConfig(**fields)


def _as_ids(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def config_to_hf(cfg: DecoderConfig):
    """The transformers config object that describes the same model."""
    import transformers

    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "qwen3": transformers.Qwen3Config}
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.max_position_embeddings,
        bos_token_id=cfg.bos_token_id, eos_token_id=_list_ids(cfg.eos_token_id),
        pad_token_id=cfg.pad_token_id, torch_dtype=cfg.param_dtype)
    if cfg.model_type == "llama":
        kwargs.update(attention_bias=cfg.o_bias, mlp_bias=False)
        if cfg.qkv_bias != cfg.o_bias:
            raise CheckpointError("a llama checkpoint has either all or none of q/k/v/o biases")
    elif cfg.model_type == "qwen2" and not cfg.qkv_bias:
        raise CheckpointError("qwen2 checkpoints always have q/k/v biases (qkv_bias=True)")
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        kwargs["rope_scaling"] = ({"rope_type": "linear", "factor": s.factor} if s.rope_type == "linear"
                                  else {"rope_type": "llama3", "factor": s.factor,
                                        "low_freq_factor": s.low_freq_factor,
                                        "high_freq_factor": s.high_freq_factor,
                                        "original_max_position_embeddings":
                                            s.original_max_position_embeddings})
    return classes[cfg.model_type](**kwargs)


def _list_ids(value):
    return list(value) if isinstance(value, tuple) else value


# ---- the name/layout table ------------------------------------------------------------------------
def _weight_table(cfg: DecoderConfig) -> dict[str, tuple[str, Callable, Callable]]:
    """crl_jax param path -> (HF name with {i} for the layer, HF->ours, ours->HF) per layer."""
    n, k, h, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size

    def proj_in(heads):  # HF [heads*h, d] -> ours [d, heads, h]
        return (lambda w: w.reshape(heads, h, d).transpose(2, 0, 1),
                lambda w: w.transpose(1, 2, 0).reshape(heads * h, d))

    def bias(heads):
        return (lambda b: b.reshape(heads, h), lambda b: b.reshape(heads * h))

    same = (lambda w: w, lambda w: w)
    transpose = (lambda w: w.T, lambda w: w.T)
    attn = "model.layers.{i}.self_attn."
    table = {
        "input_norm": ("model.layers.{i}.input_layernorm.weight", *same),
        "wq": (attn + "q_proj.weight", *proj_in(n)),
        "wk": (attn + "k_proj.weight", *proj_in(k)),
        "wv": (attn + "v_proj.weight", *proj_in(k)),
        "wo": (attn + "o_proj.weight", lambda w: w.reshape(d, n, h).transpose(1, 2, 0),
               lambda w: w.transpose(2, 0, 1).reshape(d, n * h)),
        "post_attention_norm": ("model.layers.{i}.post_attention_layernorm.weight", *same),
        "w_gate": ("model.layers.{i}.mlp.gate_proj.weight", *transpose),
        "w_up": ("model.layers.{i}.mlp.up_proj.weight", *transpose),
        "w_down": ("model.layers.{i}.mlp.down_proj.weight", *transpose),
    }
    if cfg.qkv_bias:
        table.update(bq=(attn + "q_proj.bias", *bias(n)), bk=(attn + "k_proj.bias", *bias(k)),
                     bv=(attn + "v_proj.bias", *bias(k)))
    if cfg.o_bias:
        table["bo"] = (attn + "o_proj.bias", *same)
    if cfg.qk_norm:
        table.update(q_norm=(attn + "q_norm.weight", *same), k_norm=(attn + "k_norm.weight", *same))
    return table


def _global_table(cfg: DecoderConfig):
    table = {"embed": ("model.embed_tokens.weight", lambda w: w, lambda w: w),
             "final_norm": ("model.norm.weight", lambda w: w, lambda w: w)}
    if not cfg.tie_embeddings:
        table["lm_head"] = ("lm_head.weight", lambda w: w.T, lambda w: w.T)
    return table


# ---- reading a folder -----------------------------------------------------------------------------
class _FolderTensors:
    """All tensors of a checkpoint folder, opened lazily, single file or sharded with an index."""

    def __init__(self, path: str):
        from crl_jax.models.safetensors_file import SafetensorsFile

        index_path = os.path.join(path, "model.safetensors.index.json")
        single_path = os.path.join(path, "model.safetensors")
        if os.path.exists(index_path):
            weight_map = read_json(index_path)
            if not isinstance(weight_map, dict) or not isinstance(weight_map.get("weight_map"), dict):
                raise CheckpointError(f"{index_path}: no 'weight_map'; {REDOWNLOAD}")
            weight_map = weight_map["weight_map"]
            files = {}
            for file_name in sorted(set(weight_map.values())):
                file_path = os.path.join(path, file_name)
                if not os.path.exists(file_path):
                    raise CheckpointError(f"{path}: shard {file_name} listed in "
                                          "model.safetensors.index.json is missing")
                files[file_name] = SafetensorsFile(file_path)
            self._where = {name: files[file_name] for name, file_name in weight_map.items()}
        elif os.path.exists(single_path):
            single = SafetensorsFile(single_path)
            self._where = {name: single for name in single.names()}
        else:
            present = sorted(os.listdir(path))
            raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json "
                                  f"(found: {', '.join(present) or 'nothing'})")

    def __contains__(self, name):
        return name in self._where

    def names(self):
        return list(self._where)

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise CheckpointError(f"checkpoint is missing tensor {name}; {REDOWNLOAD}")
        return self._where[name].get(name)


def _expected_hf_shape(to_hf, our_shape):
    return jax.eval_shape(to_hf, jax.ShapeDtypeStruct(our_shape, jnp.float32)).shape


def _load_param(tensors: _FolderTensors, cfg: DecoderConfig, name: str, our_shape, dtype,
                layered: bool) -> np.ndarray:
    """Assemble one crl_jax parameter (stacked over layers if `layered`) as a host array."""
    table = _weight_table(cfg) if layered else _global_table(cfg)
    hf_name, from_hf, to_hf = table[name]
    per_item_shape = our_shape[1:] if layered else our_shape
    expected = _expected_hf_shape(to_hf, per_item_shape)
    hf_names = [hf_name.format(i=i) for i in range(cfg.num_layers)] if layered else [hf_name]
    out = np.empty(our_shape, dtype)
    for index, tensor_name in enumerate(hf_names):
        tensor = tensors.get(tensor_name)
        if tuple(tensor.shape) != tuple(expected):
            raise CheckpointError(f"tensor {tensor_name} has shape {tuple(tensor.shape)}, "
                                  f"expected {tuple(expected)} for this config")
        value = from_hf(np.asarray(tensor, np.float32) if tensor.dtype != dtype else tensor)
        if layered:
            out[index] = value
        else:
            out[...] = value
    return out


def from_pretrained(path: str, *, mesh: Mesh | None = None, **config_overrides) -> Decoder:
    """Load a local Hugging Face folder into a Decoder (float32 unless `param_dtype`/`dtype` say
    otherwise). With `mesh`, parameters are born sharded by their logical axes. Files that cannot
    be used raise BadModelFile (CheckpointError) naming them."""
    with named_if_unusable(os.fspath(path)):
        return _from_pretrained(os.fspath(path), mesh, config_overrides)


def _from_pretrained(path: str, mesh: Mesh | None, config_overrides: dict) -> Decoder:
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (expected a Hugging Face checkpoint folder)")
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise CheckpointError(f"{path}: config.json is missing")
    hf_config = read_json(config_path)
    missing = [key for key in REQUIRED_CONFIG_KEYS if not isinstance(hf_config, dict)
               or hf_config.get(key) is None]
    if missing:
        raise CheckpointError(f"{config_path}: missing key(s) {', '.join(missing)}; "
                              "restore the checkpoint's own config.json")
    try:
        cfg = config_from_hf(hf_config, **config_overrides)
    except (TypeError, ValueError, KeyError) as err:
        if isinstance(err, CheckpointError):
            raise CheckpointError(f"{config_path}: {err}") from None
        raise CheckpointError(f"{config_path}: {err}; restore the checkpoint's own config.json") from None
    tensors = _FolderTensors(path)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    axes = param_logical_axes(abstract_state)
    flat_state = nnx.to_flat_state(abstract_state)
    flat_axes = dict(nnx.to_flat_state(axes))
    dtype = np.dtype(cfg.weight_dtype)
    loaded = []
    for key, variable in flat_state:
        layered = key[0] == "layers"
        name = key[-1]
        host = _load_param(tensors, cfg, name, variable.value.shape, dtype, layered)
        if mesh is None:
            value = jnp.asarray(host)
        else:
            spec_axes = flat_axes[key]
            spec_axes = spec_axes.value if isinstance(spec_axes, nnx.Variable) else spec_axes
            target = sharding.logical_sharding(mesh, spec_axes, host.shape)
            value = jax.make_array_from_callback(host.shape, target, lambda idx, h=host: h[idx])
        loaded.append((key, variable.replace(value)))
    state = nnx.from_flat_state(loaded)
    return nnx.merge(graphdef, state)


def save_pretrained(model: Decoder, path: str) -> None:
    """Write `model` as a Hugging Face folder (config.json + model.safetensors)."""
    from crl_jax.models.safetensors_file import save_file

    cfg = model.config
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for name, (hf_name, _, to_hf) in _weight_table(cfg).items():
        stacked = np.asarray(jax.device_get(getattr(model.layers, name).value))
        for i in range(cfg.num_layers):
            tensors[hf_name.format(i=i)] = np.ascontiguousarray(to_hf(stacked[i]))
    for name, (hf_name, _, to_hf) in _global_table(cfg).items():
        tensors[hf_name] = np.ascontiguousarray(to_hf(np.asarray(jax.device_get(getattr(model, name).value))))
    save_file(tensors, os.path.join(path, "model.safetensors"))
    config_to_hf(cfg).save_pretrained(path)
