"""Decoder parity with transformers (PyTorch, float32) on tiny random checkpoints made here."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from crl_jax import models  # noqa: E402

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

ARCHITECTURES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(tie_word_embeddings=False, rope_scaling=LLAMA3_SCALING)),
    "llama_bias": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(tie_word_embeddings=True, attention_bias=True, rope_theta=500.0)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(tie_word_embeddings=False)),
}


def make_checkpoint(arch: str, path, seed: int = 0):
    config_cls, model_cls, extra = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=256, **extra)
    model = model_cls(config).eval()
    # Random init leaves norms at 1 and biases at 0; perturb them so parity covers them too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def padded_batch(padding: str, rng, vocab=101, lengths=(13, 9, 4, 1)):
    time = max(lengths)
    tokens = rng.integers(0, vocab, (len(lengths), time))
    mask = np.zeros(tokens.shape, bool)
    for row, length in enumerate(lengths):
        if padding == "left":
            mask[row, time - length:] = True
        else:
            mask[row, :length] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return tokens, mask, positions


def torch_logits(model, tokens, mask, positions):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                     position_ids=torch.tensor(positions)).logits.numpy()


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_checkpoint(request.param, path)


# Every attention implementation a CPU runs: a block of 8 splits the 13-token batch; splash runs
# in Pallas interpret mode (its block is at least 128, so the batch is padded to one block).
# The long-sequence setting runs the MLP in time chunks too (4 tokens: 13 padded to 16).
ATTENTION = {"materialized": {}, "blockwise": dict(attention="blockwise", attention_block=8),
             "splash": dict(attention="splash", attention_block=128),
             "blockwise_mlp_chunks": dict(attention="blockwise", attention_block=8, mlp_chunk=4)}


@pytest.mark.parametrize("attention", sorted(ATTENTION))
@pytest.mark.parametrize("padding", ["left", "right"])
def test_logits_match_transformers(checkpoint, padding, attention):
    arch, path, reference = checkpoint
    model = models.from_pretrained(path, **ATTENTION[attention])
    if arch == "llama":
        assert model.config.rope_scaling is not None and model.config.rope_scaling.rope_type == "llama3"
    tokens, mask, positions = padded_batch(padding, np.random.default_rng(1))
    ours = np.asarray(model(jnp.asarray(tokens), positions=jnp.asarray(positions),
                            attention_mask=jnp.asarray(mask)))
    expected = torch_logits(reference, tokens, mask, positions)
    assert ours.shape == expected.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours[mask], expected[mask], atol=1e-4, rtol=0)
    # Default positions are cumsum(mask) - 1, the same as the explicit ones here.
    defaults = np.asarray(model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))
    np.testing.assert_allclose(defaults[mask], ours[mask], atol=1e-6, rtol=0)


def test_save_pretrained_round_trip(checkpoint, tmp_path):
    arch, path, _ = checkpoint
    model = models.from_pretrained(path)
    models.save_pretrained(model, tmp_path)
    _, model_cls, _ = ARCHITECTURES[arch]
    reloaded = model_cls.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens, mask, positions = padded_batch("right", np.random.default_rng(2))
    ours = np.asarray(model(jnp.asarray(tokens), positions=jnp.asarray(positions),
                            attention_mask=jnp.asarray(mask)))
    np.testing.assert_allclose(torch_logits(reloaded, tokens, mask, positions)[mask], ours[mask],
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("attention", ["materialized", "blockwise"])  # splash: whole sequences only
def test_kv_cache_chunks_equal_full_forward(checkpoint, attention):
    """Prefill, then appended chunks of different lengths per row, then single-token steps: the
    logits of every real token equal those of one forward over the concatenated sequence."""
    _, path, _ = checkpoint
    model = models.from_pretrained(path, **ATTENTION[attention])
    rng = np.random.default_rng(3)
    chunk_lengths = [(5, 3), (2, 4), (1, 1), (1, 0)]  # per chunk: (row 0, row 1) real lengths
    cache = models.init_cache(model.config, batch_size=2, max_len=24)
    pieces = [[], []]
    outputs = [[], []]
    for lengths in chunk_lengths:
        width = max(lengths)
        tokens = rng.integers(0, 101, (2, width))
        mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]  # right padded
        logits, cache = model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask), cache=cache)
        for row in range(2):
            pieces[row].extend(tokens[row, :lengths[row]])
            outputs[row].extend(np.asarray(logits)[row, :lengths[row]])
    np.testing.assert_array_equal(np.asarray(cache.end), [len(p) for p in pieces])
    for row in range(2):
        full = np.asarray(model(jnp.asarray([pieces[row]])))[0]
        np.testing.assert_allclose(np.stack(outputs[row]), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dot_chunk", [0, 16])
def test_per_layer_cache_equals_the_stacked_one(checkpoint, dot_chunk):
    """A sampler's decode loop on a CPU splits the cache and the layer weights into per-layer
    pieces (layers unrolled, MLP weights [out, in]); each step's logits and the restacked cache
    equal the scanned layers' on the stacked cache, with plain or chunked dots."""
    from flax import nnx

    _, path, _ = checkpoint
    graphdef, params = nnx.split(models.from_pretrained(path, dot_chunk=dot_chunk))
    stacked = models.init_cache(models.from_pretrained(path).config, batch_size=2, max_len=12)
    _, stacked = models.apply(graphdef, params, jnp.asarray([[3, 4, 5], [6, 7, 0]]),
                              attention_mask=jnp.asarray([[1, 1, 1], [1, 1, 0]]), cache=stacked)
    split, split_params = models.split_cache_layers(stacked), models.split_param_layers(params)
    for token in ([[8], [9]], [[10], [0]], [[11], [12]]):
        mask = jnp.asarray(token) > 0
        ours, split = models.apply(graphdef, split_params, jnp.asarray(token), attention_mask=mask,
                                   cache=split)
        reference, stacked = models.apply(graphdef, params, jnp.asarray(token), attention_mask=mask,
                                          cache=stacked)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), atol=1e-5, rtol=0)
    restacked = models.stack_cache_layers(split)
    for ours, reference in zip(jax.tree.leaves(restacked), jax.tree.leaves(stacked)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_single")
    make_checkpoint("qwen3", path)
    return path


def test_bad_inputs_raise_clear_errors(qwen3_checkpoint):
    path = qwen3_checkpoint
    model = models.from_pretrained(path)
    with pytest.raises(ValueError, match="tokens must be"):
        model(jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model(jnp.zeros((2, 3), jnp.int32), attention_mask=jnp.ones((2, 4), bool))


def test_bfloat16_policy_is_close_to_float32(qwen3_checkpoint):
    path = qwen3_checkpoint
    full = models.from_pretrained(path)
    half = models.from_pretrained(path, param_dtype="bfloat16", dtype="bfloat16")
    assert half.layers.wq.value.dtype == jnp.bfloat16
    tokens, mask, positions = padded_batch("right", np.random.default_rng(4))
    a = np.asarray(full(jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))
    b = np.asarray(half(jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))
    assert b.dtype == np.float32
    assert np.abs(a - b)[mask].max() < 0.05 * np.abs(a).max()


def test_remat_policies_give_identical_gradients(qwen3_checkpoint):
    """Every remat policy, and the MLP in time chunks (7 tokens in chunks of 3), give the same
    gradients."""
    path = qwen3_checkpoint
    from flax import nnx

    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 101, (2, 7)))
    grads = []
    for policy, mlp_chunk in (("none", 0), ("full", 0), ("dots", 0), ("none", 3), ("full", 3)):
        graphdef, params = nnx.split(models.from_pretrained(path, remat=policy, mlp_chunk=mlp_chunk))
        loss = lambda p: models.apply(graphdef, p, tokens).mean()  # noqa: E731
        grads.append(jax.grad(loss)(params))
    for other in grads[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grads[0], other)


def test_chunked_dots_keep_parity(checkpoint):
    """dot_chunk changes how the weight matmuls are summed, not what they compute."""
    arch, path, ref = checkpoint
    tokens, mask, positions = padded_batch("left", np.random.default_rng(3))
    model = models.from_pretrained(path, dot_chunk=16)   # 64 = 4 chunks, 96 = 6
    ours = np.asarray(model(jnp.asarray(tokens), positions=jnp.asarray(positions),
                            attention_mask=jnp.asarray(mask)))
    want = torch_logits(ref, tokens, mask, positions)
    np.testing.assert_allclose(ours[mask], want[mask], atol=1e-4)


def test_dense_blocked_sum_is_closer_to_float64():
    from crl_jax.models.layers import dense

    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal((2, 20, 8, 72))).astype(np.float32)   # contracts 8 x 72 = 576
    w = (0.05 * rng.standard_normal((8, 72, 512))).astype(np.float32)
    exact = np.einsum("btnh,nhd->btd", x.astype(np.float64), w.astype(np.float64))
    plain = np.asarray(jax.jit(lambda a, b: dense("btnh,nhd->btd", a, b))(x, w))
    chunked = np.asarray(jax.jit(lambda a, b: dense("btnh,nhd->btd", a, b, 64))(x, w))
    assert chunked.shape == exact.shape
    assert np.abs(chunked - exact).mean() < 0.6 * np.abs(plain - exact).mean()
    # Weights stored [out, in] sum the same chunks in the same order.
    w_out_in = np.ascontiguousarray(w.transpose(2, 0, 1))
    chunked_out_in = np.asarray(jax.jit(lambda a, b: dense("btnh,dnh->btd", a, b, 64))(x, w_out_in))
    np.testing.assert_allclose(chunked_out_in, chunked, rtol=0, atol=1e-6)
    assert np.abs(chunked_out_in - exact).mean() < 0.6 * np.abs(plain - exact).mean()
    # A contraction that is not a multiple of the chunk falls back to the single dot.
    odd = np.asarray(dense("btnh,nhd->btd", x, w, 100))
    np.testing.assert_array_equal(odd, np.asarray(dense("btnh,nhd->btd", x, w)))
    with pytest.raises(ValueError, match="last axes"):
        dense("bdt,df->btf", x[..., 0], w[0], 8)


def test_stacked_gate_and_up_gradient_equals_float64_reference():
    """The MLP's stacked input product carries its own gradient; it must be the true one."""
    from crl_jax.models.layers import stacked_gate_and_up

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w_gate, w_up = (0.3 * rng.standard_normal((2, 8, 6))).astype(np.float32)
    d_gate, d_up = rng.standard_normal((2, 2, 5, 6)).astype(np.float32)   # cotangents

    def pulled(a, g, u):
        gate, up = stacked_gate_and_up(a, g, u)
        return jnp.sum(gate * d_gate) + jnp.sum(up * d_up)

    gate, up = stacked_gate_and_up(x, w_gate, w_up)
    dx, dg, du = jax.jit(jax.grad(pulled, argnums=(0, 1, 2)))(x, w_gate, w_up)
    x64, g64, u64 = (a.astype(np.float64) for a in (x, w_gate, w_up))
    np.testing.assert_allclose(gate, x64 @ g64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(up, x64 @ u64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, d_gate @ g64.T + d_up @ u64.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dg, np.einsum("btd,btf->df", x64, d_gate), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(du, np.einsum("btd,btf->df", x64, d_up), rtol=1e-5, atol=1e-5)
