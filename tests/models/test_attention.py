"""Every attention implementation against a plain reference, forward and gradients.

The reference is softmax attention written out here with the kv heads repeated, differentiated
by autodiff: independent of crl_jax's layout and of its hand-written backward passes.

Cases: left and right padding, grouped-query heads (G = 2 and 3, and one kv head), head dims that
are not hidden / heads, and lengths that are not multiples of the block. Padding queries have no
specified output (splash, for one, lets them see only padding) and are left out of the
comparison and of the loss.
Splash runs in Pallas interpret mode; cuDNN's wiring is checked through the same call with XLA's
implementation (a CPU has no cuDNN).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.models import attention as attention_lib
from crl_jax.models.layers import MASK_VALUE, grouped_attention

CASES = [  # (batch, time, heads, kv heads, head dim, block, padding)
    (2, 37, 4, 2, 6, 16, "left"),
    (2, 64, 6, 3, 10, 16, "right"),
    (1, 100, 4, 1, 8, 32, "none"),
    (3, 33, 2, 2, 4, 8, "left"),
]


def plain_attention(q, k, v, visible):
    """q [B,T,N,H], k/v [B,K,S,H], visible [B,T,S] -> [B,T,N,H]; query head i reads kv head
    i // (N / K)."""
    repeat = q.shape[2] // k.shape[1]
    k, v = jnp.repeat(k, repeat, axis=1), jnp.repeat(v, repeat, axis=1)
    scores = jnp.einsum("btnh,bnsh->bnts", q, k) / np.sqrt(q.shape[-1])
    probs = jax.nn.softmax(jnp.where(visible[:, None], scores, MASK_VALUE), axis=-1)
    return jnp.einsum("bnts,bnsh->btnh", probs, v)


def reference(q, k, v, key_valid, q_slots):
    visible = key_valid[:, None, :] & (jnp.arange(k.shape[2])[None, None, :] <= q_slots[:, :, None])
    return plain_attention(q, k, v, visible)


def make_case(batch, time, heads, kv_heads, head_dim, padding, seed=0):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    q, k, v = (normal(batch, time, heads, head_dim), normal(batch, kv_heads, time, head_dim),
               normal(batch, kv_heads, time, head_dim))
    valid = np.ones((batch, time), bool)
    if padding == "left":
        valid[0, :5], valid[-1, :11] = False, False
    elif padding == "right":
        valid[0, -7:] = False
    valid = jnp.asarray(valid)
    seen = valid[:, :, None, None]  # real queries
    weights = normal(batch, time, heads, head_dim) * seen
    return q, k, v, valid, seen, weights


def assert_matches_reference(fn, q, k, v, valid, seen, weights, q_slots=None, atol=1e-5):
    slots = q_slots if q_slots is not None else jnp.broadcast_to(jnp.arange(q.shape[1]), valid.shape)
    ref = functools.partial(reference, key_valid=valid, q_slots=slots)
    np.testing.assert_allclose(fn(q, k, v) * seen, ref(q, k, v) * seen, atol=atol, rtol=0)
    grads = jax.grad(lambda *a: jnp.sum(fn(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    for name, got, expected in zip("qkv", grads, want):
        np.testing.assert_allclose(got, expected, atol=atol, rtol=0, err_msg=f"d{name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[1]}-N{c[2]}K{c[3]}H{c[4]}-{c[6]}")
@pytest.mark.parametrize("implementation", ["materialized", "blockwise", "cudnn_wiring"])
def test_whole_sequence_equals_the_reference(implementation, case):
    batch, time, heads, kv_heads, head_dim, block, padding = case
    q, k, v, valid, seen, weights = make_case(batch, time, heads, kv_heads, head_dim, padding)
    if implementation == "cudnn_wiring":
        fn = lambda q, k, v: attention_lib._cudnn(q, k, v, valid, None)  # noqa: E731
    else:
        fn = lambda q, k, v: attention_lib.attention(  # noqa: E731
            q, k, v, valid, implementation=implementation, block=block)
    assert_matches_reference(fn, q, k, v, valid, seen, weights)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_splash_in_interpret_mode_equals_the_reference(padding):
    q, k, v, valid, seen, weights = make_case(2, 200, 4, 2, 16, padding, seed=1)  # T padded to 256
    fn = lambda q, k, v: attention_lib.attention(  # noqa: E731
        q, k, v, valid, implementation="splash", block=128)
    assert_matches_reference(fn, q, k, v, valid, seen, weights)


@pytest.mark.parametrize("keys_transposed", [False, True], ids=["keys_BKSH", "keys_BKHS"])
@pytest.mark.parametrize("implementation", ["materialized", "blockwise", "splash", "cudnn"])
def test_queries_against_a_cache_equal_the_reference(implementation, keys_transposed):
    """A prefill chunk against a KV cache: queries at slots past the cache's end, empty slots.
    Splash and cuDNN take whole sequences only, so a model set to them falls back here. Keys
    also as a per-layer decode cache stores them, [B,K,H,S]."""
    rng = np.random.default_rng(2)
    b, t, s, n, kh, h = 2, 5, 40, 4, 2, 8
    q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, kh, s, h)), jnp.float32) for _ in range(2))
    valid = np.zeros((b, s), bool)
    valid[0, :20], valid[1, 3:25] = True, True
    valid = jnp.asarray(valid)
    slots = jnp.asarray([[15, 16, 17, 18, 19], [20, 21, 22, 23, 24]])
    fn = lambda q, k, v: attention_lib.attention(  # noqa: E731
        q, jnp.swapaxes(k, 2, 3) if keys_transposed else k, v, valid, slots,
        implementation=implementation, block=8, keys_transposed=keys_transposed)
    weights = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    assert_matches_reference(fn, q, k, v, valid, jnp.ones((b, t, 1, 1), bool), weights, q_slots=slots)


@pytest.mark.parametrize("keys_transposed", [False, True], ids=["keys_BKSH", "keys_BKHS"])
@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 2e-6), (jnp.bfloat16, 3e-2)])
def test_grouped_attention_backward_equals_autodiff(keys_transposed, dtype, atol):
    """The hand-written backward of the materialised product, on an arbitrary mask with a row
    that sees no key at all (its masked keys must get no gradient), in float32 and bfloat16."""
    rng = np.random.default_rng(5)
    b, t, s, n, kh, h = 2, 6, 11, 6, 2, 8
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    q, k, v, weights = normal(b, t, n, h), normal(b, kh, s, h), normal(b, kh, s, h), normal(b, t, n, h)
    visible = jnp.asarray(rng.random((b, t, s)) < 0.6).at[1, 2].set(False)

    def loss(attend):
        return lambda q, k, v: jnp.sum((attend(q, k, v).astype(jnp.float32) * weights))

    def ours(q, k, v):
        return grouped_attention(q, jnp.swapaxes(k, 2, 3) if keys_transposed else k, v, visible,
                                 keys_transposed=keys_transposed)

    upcast = lambda *a: plain_attention(*(x.astype(jnp.float32) for x in a), visible)  # noqa: E731
    got = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(upcast), argnums=(0, 1, 2))(q, k, v)
    assert all(g.dtype == dtype for g in got)
    for name, g, w in zip("qkv", got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), w, atol=atol, rtol=atol,
                                   err_msg=f"d{name}")


def _largest_tensor(implementation: str, t: int, block: int) -> int:
    """Elements of the largest tensor in the lowered forward + backward program."""
    import re

    q = jax.ShapeDtypeStruct((1, t, 2, 8), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 2, t, 8), jnp.float32)
    valid = jax.ShapeDtypeStruct((1, t), jnp.bool_)

    def loss(q, k, v, valid):
        return jnp.sum(attention_lib.attention(q, k, v, valid, implementation=implementation,
                                               block=block))

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, valid).as_text()
    return max(int(np.prod([int(d) for d in dims.split("x")]))
               for dims in re.findall(r"tensor<((?:\d+x)*\d+)x[a-z]", text))


def test_blockwise_never_builds_time_by_time_scores():
    """Its largest intermediate is block-sized (2 heads x 128 x 128 scores); the materialised
    program, the control, holds score tensors of whole rows of keys."""
    t, block = 1024, 128
    assert _largest_tensor("blockwise", t, block) <= 2 * block * block < t * t // 8
    assert _largest_tensor("materialized", t, block) >= t * t // 4


def test_auto_and_bad_names():
    assert attention_lib.resolve("auto", 128, 128, whole_sequence=True) == "materialized"
    assert attention_lib.resolve("auto", 4096, 4096, whole_sequence=True) == "blockwise"
    assert attention_lib.resolve("auto", 1, 65536, whole_sequence=False) == "materialized"
    with pytest.raises(ValueError, match="attention implementation must be one of"):
        attention_lib.resolve("flash", 8, 8, whole_sequence=True)


def test_blockwise_update_needs_far_less_memory_at_4096_tokens():
    """The tiny preset's whole update (XLA's memory analysis of the compiled step, nothing run):
    blockwise attention's temporaries grow linearly with T, the materialised one's with T^2.
    With the MLP in time chunks (both sides) the blockwise update needs under a quarter of the
    materialised one's memory; with the MLP whole, its [T, F] activations are most of what
    remains. benchmarks/attention.py reports the same figures beside each side's speed."""
    from crl_jax import models, sharding
    from crl_jax.rl import aot, memory_fit, state as state_lib, train_step as ts

    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])

    def temp_bytes(implementation, seq, mlp_chunk=512):
        cfg = models.get_preset("tiny", attention=implementation, mlp_chunk=mlp_chunk)
        state = aot.abstract_state(cfg, state_lib.OptimizerConfig())
        compiled = aot.compile_update(ts.TrainConfig(), mesh, state, None, (1, seq),
                                      compiler_options=memory_fit.sizing_options(mesh.devices.flat[0]))
        return compiled.memory_analysis().temp_size_in_bytes

    blockwise, materialized = temp_bytes("blockwise", 4096), temp_bytes("materialized", 4096)
    assert blockwise <= 0.25 * materialized  # measured 0.19
    assert blockwise < 2.1 * temp_bytes("blockwise", 2048)
    whole_mlp = temp_bytes("blockwise", 4096, mlp_chunk=0)
    assert blockwise < 0.7 * whole_mlp  # measured 0.58
    assert whole_mlp < 0.35 * temp_bytes("materialized", 4096, mlp_chunk=0)  # measured 0.30


def test_context_parallel_splash_equals_the_reference_on_a_mesh():
    """Queries split along T over fsdp (4 shards), keys and values gathered, heads over tensor:
    splash in interpret mode under shard_map on the 8 simulated devices."""
    from crl_jax.sharding import make_mesh

    q, k, v, valid, seen, weights = make_case(2, 500, 4, 2, 16, "left", seed=3)  # T padded to 512
    fn = lambda q, k, v: attention_lib.attention(  # noqa: E731
        q, k, v, valid, implementation="splash", block=128, context_parallel=True)
    with jax.set_mesh(make_mesh((1, 4, 2))):
        assert_matches_reference(jax.jit(fn), q, k, v, valid, seen, weights)


def test_context_parallel_decoder_equals_the_plain_one():
    """The decoder with context parallelism (activations split along T at every layer, splash
    gathering keys and values) gives the logits of the materialised decoder."""
    from flax import nnx

    from crl_jax import models
    from crl_jax.sharding import make_mesh

    cfg = models.get_preset("nano", vocab_size=64)
    graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 64, (2, 300)))
    mask = jnp.ones(tokens.shape, bool).at[1, :17].set(False)

    def logits(config):
        model = nnx.merge(graphdef, params)
        model.config = config
        g, p = nnx.split(model)
        return jax.jit(lambda p: models.apply(g, p, tokens, attention_mask=mask))(p)

    plain = logits(cfg.replace(attention="materialized"))
    with jax.set_mesh(make_mesh((1, 4, 2))):
        split = logits(cfg.replace(attention="splash", attention_block=128, context_parallel=True))
    np.testing.assert_allclose(np.asarray(split)[np.asarray(mask)], np.asarray(plain)[np.asarray(mask)],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("rows", [1, 2])
def test_materialized_attention_in_batch_chunks_equals_the_reference(monkeypatch, rows):
    """On one CPU device a batch whose scores pass the chunk budget is attended a few rows at a
    time (`lax.map` over chunks); values and gradients stay the reference's."""
    from crl_jax.models import layers

    batch, time, heads = 12, 37, 4
    row_bytes = heads * time * time * 4  # one query block: 37 queries against 37 keys
    monkeypatch.setattr(layers, "CPU_SCORE_CHUNK_BYTES", rows * row_bytes)
    assert layers._rows_per_chunk(batch, row_bytes) == rows
    q, k, v, valid, seen, weights = make_case(batch, time, heads, 2, 6, "left", seed=6)
    fn = lambda q, k, v: attention_lib.attention(q, k, v, valid, implementation="materialized")  # noqa: E731
    assert_matches_reference(jax.jit(fn), q, k, v, valid, seen, weights)


def test_batch_chunks_divide_the_batch_and_leave_a_sharded_batch_whole(monkeypatch):
    from crl_jax.models import layers
    from crl_jax.sharding import make_mesh

    monkeypatch.setattr(layers, "CPU_SCORE_CHUNK_BYTES", 4 * 1000)
    assert layers._rows_per_chunk(18, 1000) == 3  # the largest divisor within the budget
    assert layers._rows_per_chunk(17, 1000) == 1
    assert layers._rows_per_chunk(16, 1000) == 16  # up to 4 chunks' worth: whole
    assert layers._rows_per_chunk(3, 10**9) == 1  # one row past the budget: still one row
    with jax.set_mesh(make_mesh((2, 2, 2))):
        assert layers._rows_per_chunk(8, 10**9) == 8
