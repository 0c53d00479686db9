"""The joint train step: golden numbers, 1-device vs 2x4 mesh, non-finite skip, accumulation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax import models, sharding
from crl_jax.rl import batch as batch_lib
from crl_jax.rl import logprobs as logprobs_lib
from crl_jax.rl import state as state_lib
from crl_jax.rl import train_step as ts

ACTOR_CFG = models.get_preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
# The extractor differs in family (Qwen3: q/k norm, untied head) like the paper's pair.
EXTRACTOR_CFG = ACTOR_CFG.replace(model_type="qwen3", qkv_bias=False, qk_norm=True,
                                  tie_embeddings=False)
CFG = ts.TrainConfig(actor_micro_batches=2, old_logprobs="sampler", logprob_chunk=8,
                     log_entropy=True)
OPT = state_lib.OptimizerConfig(learning_rate=1e-3, weight_decay=0.01)

# Recorded once from this test's own single-device run (float32, highest matmul precision).
GOLDEN = {
    "actor/loss": 0.0038055479526519775,
    "extractor/loss": 1.156450629234314,
    "actor/grad_norm": 0.35510966181755066,
    "extractor/grad_norm": 0.8764978051185608,
    "actor_update_checksum": 82.93678283691406,
    "extractor_update_checksum": 85.70049285888672,
}


def _make_states(mesh):
    """Eager init then placement: cheaper to compile than the born-sharded path used at scale
    (which test_mesh_2x4_matches_single_device checks gives the same values)."""
    tx = state_lib.make_optimizer(OPT)
    states = []
    for seed, cfg in ((0, ACTOR_CFG), (1, EXTRACTOR_CFG)):
        graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(seed)))
        state = state_lib.TrainState.create(graphdef, params, tx, jax.random.PRNGKey(seed))
        states.append(jax.device_put(state, state_lib.state_shardings(mesh, state)))
    return tuple(states)


def _make_batch(seed=0, b=8, t=16):
    rng = np.random.default_rng(seed)

    def part(n, rewards, **kw):
        lengths = rng.integers(t // 2, t + 1, n)
        attn = np.arange(t)[None, :] < lengths[:, None]
        loss = attn & (np.arange(t)[None, :] >= 4)  # prompt (4 tokens) and padding are masked
        return batch_lib.make_policy_batch(
            rng.integers(0, 64, (n, t)), loss, rewards, attention_mask=attn,
            old_logprobs=-rng.uniform(3.5, 4.8, (n, t)), **kw)

    actor = part(b, rng.integers(0, 2, b), group_ids=np.repeat([3, 7], b // 2),
                 guided=np.tile(np.arange(b // 2) >= b // 4, 2))
    extractor = part(4, rng.choice([-1.0, 1.0, 0.5], 4), weights=np.array([1.0, 0.0, 0.7, 0.5]))
    return batch_lib.TrainBatch(actor, extractor)


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)  # the step donates its states


@jax.jit
def _update_checksum(new, old):
    return state_lib.params_checksum(jax.tree.map(lambda a, b: a - b, new, old))


@pytest.fixture(scope="module")
def single():
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    actor, extractor = _make_states(mesh)
    batch = _make_batch()
    step = ts.make_train_step(CFG, mesh, actor, extractor, batch)
    new_actor, new_extractor, metrics = step(_copy(actor), _copy(extractor), batch)
    return dict(step=step, actor=actor, extractor=extractor, batch=batch, new_actor=new_actor,
                new_extractor=new_extractor, metrics=jax.device_get(metrics))


def test_golden_one_step(single):
    m = single["metrics"]
    got = {
        "actor/loss": float(m["actor/loss"]),
        "extractor/loss": float(m["extractor/loss"]),
        "actor/grad_norm": float(m["actor/grad_norm"]),
        "extractor/grad_norm": float(m["extractor/grad_norm"]),
        "actor_update_checksum": float(_update_checksum(single["new_actor"].params,
                                                        single["actor"].params)),
        "extractor_update_checksum": float(_update_checksum(single["new_extractor"].params,
                                                            single["extractor"].params)),
    }
    print("golden:", got)
    for key, want in GOLDEN.items():
        assert got[key] == pytest.approx(want, rel=1e-4, abs=1e-6), key
    assert m["actor/skipped"] == 0 and m["extractor/skipped"] == 0
    assert int(single["new_actor"].step) == 1 and int(single["new_extractor"].step) == 1
    assert 0 < m["actor/clip_frac"] < 1 and m["actor/entropy"] > 0


def test_mesh_2x4_matches_single_device(single):
    mesh = sharding.make_mesh((1, 2, 4))
    _, extractor = _make_states(mesh)
    actor = state_lib.create_sharded_state(
        lambda r: models.Decoder(ACTOR_CFG, rngs=r), state_lib.make_optimizer(OPT), mesh, 0)
    # Born sharded over fsdp x tensor, with the same values as the eager single-device init.
    for a, b in zip(jax.tree.leaves(actor.params), jax.tree.leaves(single["actor"].params)):
        np.testing.assert_allclose(jax.device_get(a), jax.device_get(b), rtol=1e-6, atol=1e-8)
    wq = actor.params["layers"]["wq"].value
    assert len(wq.sharding.device_set) == 8 and not wq.sharding.is_fully_replicated
    batch = single["batch"]
    step = ts.make_train_step(CFG, mesh, actor, extractor, batch)
    new_actor, new_extractor, metrics = step(actor, extractor, batch)
    diffs = []
    for new, ref in ((new_actor, single["new_actor"]), (new_extractor, single["new_extractor"])):
        diffs += jax.tree.leaves(jax.tree.map(
            lambda a, b: float(jnp.max(jnp.abs(jax.device_get(a) - jax.device_get(b)))),
            new.params, ref.params))
    print("mesh vs single max |diff|:", max(diffs))
    assert max(diffs) < 1e-5
    np.testing.assert_allclose(metrics["actor/loss"], single["metrics"]["actor/loss"], rtol=1e-5)


def _bitwise_equal(a, b):
    return all(jax.tree.leaves(jax.tree.map(
        lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)))


def test_non_finite_update_is_skipped_bit_identically(single):
    step, batch = single["step"], single["batch"]
    old_lp = np.array(batch.actor.old_logprobs)
    row, col = np.argwhere(np.asarray(batch.actor.loss_mask) > 0)[0]
    old_lp[row, col] = np.nan
    bad = batch.replace(actor=batch.actor.replace(old_logprobs=jnp.asarray(old_lp)))
    new_actor, new_extractor, m = step(_copy(single["actor"]), _copy(single["extractor"]), bad)
    assert m["actor/skipped"] == 1 and m["extractor/skipped"] == 0
    assert _bitwise_equal(new_actor.params, single["actor"].params)
    assert _bitwise_equal(new_actor.opt_state, single["actor"].opt_state)
    assert int(new_actor.step) == 0
    # The extractor's update is independent of the actor's failure.
    assert _bitwise_equal(new_extractor.params, single["new_extractor"].params)

    weights = np.array(batch.extractor.weights)
    weights[0] = np.inf
    bad = batch.replace(extractor=batch.extractor.replace(weights=jnp.asarray(weights)))
    new_actor, new_extractor, m = step(_copy(single["actor"]), _copy(single["extractor"]), bad)
    assert m["extractor/skipped"] == 1 and m["actor/skipped"] == 0
    assert _bitwise_equal(new_extractor.params, single["extractor"].params)
    assert _bitwise_equal(new_actor.params, single["new_actor"].params)


def test_two_micro_batches_equal_one_big_batch(single):
    actor, batch = single["actor"], single["batch"].actor
    adv = jnp.asarray(np.random.default_rng(1).normal(size=batch.tokens.shape[0]), jnp.float32)
    cfg = ts.TrainConfig(old_logprobs="sampler", log_entropy=True)  # also the unchunked head
    # Both variants in one jitted function: one compilation instead of two.
    both = jax.jit(lambda s, b, a: {n: ts._loss_and_grads(s, b, a, cfg.actor_loss, n, cfg)
                                    for n in (1, 2)})
    grads = both(actor, batch, adv)
    for key in ("loss", "clip_frac", "approx_kl", "entropy"):
        np.testing.assert_allclose(grads[2][0][key], grads[1][0][key], rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads[2][1]), jax.tree.leaves(grads[1][1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_chunked_logprobs_match_full_logits(single):
    actor, batch = single["actor"], single["batch"].actor

    @jax.jit
    def run(params):
        logits = models.apply(actor.graphdef, params, batch.tokens, positions=batch.positions,
                              attention_mask=batch.attention_mask)
        return logits, logprobs_lib.sequence_logprobs(actor.graphdef, params, batch, chunk=5)[0]

    logits, got = run(actor.params)
    logits = np.asarray(logits, np.float64)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = np.zeros(batch.tokens.shape)
    want[:, 1:] = np.take_along_axis(lsm[:, :-1], np.asarray(batch.tokens)[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_head_at_loss_tokens_gives_the_every_position_update(single):
    """`logprob_positions`: the head only at the loss tokens when they fit, every position when
    they do not (then bit-identical), and in both cases the same loss, entropy and gradient."""
    actor, batch = single["actor"], single["batch"].actor
    adv = jnp.asarray(np.random.default_rng(1).normal(size=batch.tokens.shape[0]), jnp.float32)
    count = int(np.asarray(batch.loss_mask)[:, 1:].sum())
    cfgs = {cap: ts.TrainConfig(old_logprobs="sampler", log_entropy=True, logprob_positions=cap)
            for cap in (0, count + 3, count - 1)}

    @jax.jit
    def run(params):
        logp = {cap: logprobs_lib.sequence_logprobs(actor.graphdef, params, batch, with_entropy=True,
                                                    loss_positions=cap)[0] for cap in cfgs}
        return logp, {cap: ts._loss_and_grads(actor, batch, adv, c.actor_loss, 1, c)
                      for cap, c in cfgs.items()}

    logp, out = run(actor.params)
    loss_mask = np.asarray(batch.loss_mask) > 0
    loss_mask[:, 0] = False
    gathered, every = np.asarray(logp[count + 3]), np.asarray(logp[0])
    np.testing.assert_allclose(gathered[loss_mask], every[loss_mask], rtol=1e-6, atol=1e-6)
    assert not gathered[~loss_mask].any() and every[~loss_mask].any()
    np.testing.assert_array_equal(np.asarray(logp[count - 1]), every)   # too many: every position
    for cap in (count + 3, count - 1):
        for key in ("loss", "entropy", "clip_frac"):
            np.testing.assert_allclose(out[cap][0][key], out[0][0][key], rtol=1e-6, atol=1e-7)
        for a, b in zip(jax.tree.leaves(out[cap][1]), jax.tree.leaves(out[0][1])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_config_errors_list_every_problem():
    with pytest.raises(ValueError) as err:
        ts.TrainConfig(advantage_split="none", actor_micro_batches=0, old_logprobs="cache",
                       logprob_positions=-1)
    assert len(str(err.value).splitlines()) == 5
    with pytest.raises(ValueError, match="not divisible"):
        mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
        ts.make_train_step(ts.TrainConfig(actor_micro_batches=3), mesh, None, None,
                           batch_lib.TrainBatch(_make_batch().actor))
    with pytest.raises(ValueError, match="needs an extractor state"):
        ts.make_train_step(CFG, mesh, None, None, _make_batch())


def test_a_batch_without_learning_signal_leaves_the_states_untouched(single):
    """Every rollout of every group alike (all failed): zero advantages, zero gradient. Adam
    would still move the params along the momentum of the golden step; the step keeps them."""
    step, batch = single["step"], single["batch"]
    flat = batch.replace(actor=batch.actor.replace(rewards=jnp.zeros_like(batch.actor.rewards)))
    moved = single["new_actor"]  # carries the golden step's Adam momentum
    new_actor, new_extractor, m = step(_copy(moved), _copy(single["extractor"]), flat)
    assert float(m["actor/grad_norm"]) == 0.0
    assert m["actor/skipped"] == 1 and m["actor/no_signal"] == 1 and m["extractor/no_signal"] == 0
    assert _bitwise_equal(new_actor.params, moved.params)
    assert _bitwise_equal(new_actor.opt_state, moved.opt_state)
    assert int(new_actor.step) == int(moved.step)
    # Plain AdamW would have moved them: one optimiser step on the zero gradient changes params.
    zeros = jax.tree.map(jnp.zeros_like, moved.params)
    updates, _ = moved.tx.update(zeros, moved.opt_state, moved.params)
    assert max(float(jnp.max(jnp.abs(u))) for u in jax.tree.leaves(updates)) > 0
