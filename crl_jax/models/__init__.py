"""Models of crl_jax: the Llama/Qwen decoder family, presets, and checkpoint import/export.

The contract other packages rely on is written down in API.md beside this file.
"""

from crl_jax.models.config import DecoderConfig, RopeScaling
from crl_jax.models.decoder import (CACHE_LOGICAL_AXES, SPLIT_CACHE_LOGICAL_AXES, Decoder, KVCache,
                                    apply, init_cache, param_logical_axes, split_cache_layers,
                                    split_param_layers, stack_cache_layers)
from crl_jax.models.hf_io import (CheckpointError, config_from_hf, config_to_hf, from_pretrained,
                                  save_pretrained)
from crl_jax.models.presets import get_preset, list_presets

__all__ = [
    "CACHE_LOGICAL_AXES", "CheckpointError", "Decoder", "DecoderConfig", "KVCache", "RopeScaling",
    "SPLIT_CACHE_LOGICAL_AXES", "apply", "config_from_hf", "config_to_hf", "from_pretrained",
    "get_preset", "init_cache", "list_presets", "param_logical_axes", "save_pretrained",
    "split_cache_layers", "split_param_layers", "stack_cache_layers"]
