"""Full-size presets through jax.eval_shape: published parameter counts, nothing allocated."""

import jax
import numpy as np
import pytest
from flax import nnx

from crl_jax import models

# Published parameter counts (model cards / safetensors metadata).
PUBLISHED = {
    "smollm2-135m": 134.5e6,
    "qwen2.5-0.5b": 0.494e9,
    "qwen2.5-7b": 7.62e9,
    "qwen3-4b": 4.02e9,
    "qwen3-embedding-0.6b": 0.596e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_eval_shape_gives_published_parameter_count(name):
    cfg = models.get_preset(name)
    abstract = nnx.eval_shape(lambda: models.Decoder(cfg, rngs=nnx.Rngs(0)))
    _, state = nnx.split(abstract)
    leaves = jax.tree.leaves(state)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
    count = sum(int(np.prod(leaf.shape)) for leaf in leaves)
    assert count == cfg.num_params()
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.005, count


def test_minilm_preset_gives_published_parameter_count():
    from crl_jax.models import bert

    cfg = models.get_preset("minilm-l6")
    _, state = nnx.split(nnx.eval_shape(lambda: bert.BertEncoder(cfg, rngs=nnx.Rngs(0))))
    count = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(state))
    # all-MiniLM-L6-v2 has 22,713,216 parameters, of which the 384x384 pooler (unused by
    # mean-pooled sentence embeddings, so not built) is 147,840.
    assert count == 22_713_216 - 147_840


def test_tiny_preset_is_a_few_million_parameters():
    cfg = models.get_preset("tiny")
    assert 1e6 < cfg.num_params() < 10e6


def test_every_param_has_logical_axes():
    cfg = models.get_preset("tiny", tie_embeddings=False)
    _, state = nnx.split(nnx.eval_shape(lambda: models.Decoder(cfg, rngs=nnx.Rngs(0))))
    axes = models.param_logical_axes(state)
    for (path, leaf), (_, names) in zip(nnx.to_flat_state(state), nnx.to_flat_state(axes)):
        assert isinstance(names, tuple) and len(names) == len(leaf.value.shape), path


def test_unknown_preset_and_bad_config_errors():
    with pytest.raises(KeyError, match="unknown preset"):
        models.get_preset("gpt-17")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        models.get_preset("tiny", num_kv_heads=3)
    with pytest.raises(ValueError, match="remat must be one of"):
        models.get_preset("tiny", remat="sometimes")
