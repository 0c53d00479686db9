"""Checkpoint loading: sharded loading on a mesh, index-sharded folders, and clear errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from crl_jax import models, sharding  # noqa: E402
from crl_jax.models.safetensors_file import SafetensorsFile, save_file  # noqa: E402

from tests.models.test_decoder import make_checkpoint, padded_batch  # noqa: E402


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_io")
    make_checkpoint("qwen2", path)
    return path


def test_sharded_load_on_2x4_mesh_equals_unsharded(qwen2_path):
    mesh = sharding.make_mesh((1, 2, 4))
    sharded = models.from_pretrained(qwen2_path, mesh=mesh)
    plain = models.from_pretrained(qwen2_path)
    wq = sharded.layers.wq.value
    assert len(wq.sharding.device_set) == 8
    # [L, D, N, H] with D over fsdp (2) and N heads over tensor (4): each device holds 1/8.
    assert wq.addressable_shards[0].data.shape == (3, 32, 1, 16)
    # 2 kv heads do not divide a 4-way tensor axis, so that axis stays replicated.
    assert sharded.layers.wk.value.addressable_shards[0].data.shape == (3, 32, 2, 16)
    tokens, mask, positions = padded_batch("left", np.random.default_rng(0))
    forward = jax.jit(lambda m, t, p, k: m(t, positions=p, attention_mask=k))
    a = np.asarray(forward(sharded, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    b = np.asarray(forward(plain, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    np.testing.assert_allclose(a[mask], b[mask], atol=1e-5, rtol=0)


def test_index_sharded_folder_loads(qwen2_path, tmp_path):
    """A checkpoint split over two files with model.safetensors.index.json, in bfloat16."""
    source = SafetensorsFile(os.path.join(qwen2_path, "model.safetensors"))
    names = source.names()
    import ml_dtypes

    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file_name, part in halves.items():
        save_file({n: source.get(n).astype(ml_dtypes.bfloat16) for n in part}, str(tmp_path / file_name))
        weight_map.update({n: file_name for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(source.get(n).size * 2 for n in names)}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text((qwen2_path / "config.json").read_text())
    model = models.from_pretrained(tmp_path)
    reference = models.from_pretrained(qwen2_path)
    np.testing.assert_allclose(np.asarray(model.layers.wq.value), np.asarray(reference.layers.wq.value),
                               atol=1e-2)
    # and transformers reads the folder we wrote
    transformers.Qwen2ForCausalLM.from_pretrained(tmp_path)


def test_missing_files_are_named(tmp_path, qwen2_path):
    with pytest.raises(models.CheckpointError, match="not a directory"):
        models.from_pretrained(tmp_path / "nope")
    with pytest.raises(models.CheckpointError, match="config.json is missing"):
        models.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((qwen2_path / "config.json").read_text())
    with pytest.raises(models.CheckpointError, match="no model.safetensors"):
        models.from_pretrained(tmp_path)


def test_unsupported_architecture_is_named(tmp_path, qwen2_path):
    config = json.loads((qwen2_path / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(models.CheckpointError, match="unsupported architecture model_type='gpt2'"):
        models.from_pretrained(tmp_path)


def test_wrong_shape_and_missing_tensor_are_named(tmp_path, qwen2_path):
    source = SafetensorsFile(os.path.join(qwen2_path, "model.safetensors"))
    tensors = {n: np.array(source.get(n)) for n in source.names()}
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:-1]
    (tmp_path / "config.json").write_text((qwen2_path / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(models.CheckpointError, match=r"model.layers.1.mlp.up_proj.weight has shape \(95, 64\)"):
        models.from_pretrained(tmp_path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(models.CheckpointError, match="missing tensor model.layers.1.mlp.up_proj.weight"):
        models.from_pretrained(tmp_path)
