"""The host-side updater with a fixed-shape extractor batch (rl.fixed_extractor_batch): one
compiled update per actor length, the same actor update, and an extractor left unchanged by the
empty batch of a step without samples."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from crl_jax import models, sharding
from crl_jax.memory.text_store import Generation
from crl_jax.rl import state as state_lib
from crl_jax.rl import train_step as ts
from crl_jax.rl.updater import Updater
from crl_jax.rollout.trajectory import EpisodeSpec, Trajectory, generations_batch

CFG = models.get_preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=64,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
TRAIN = ts.TrainConfig(old_logprobs="sampler")
ROWS, EXTRACTOR_ROWS, EXTRACTOR_LENGTH, PAD = 8, 4, 64, 0


def _states(mesh):
    tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=1e-2))
    states = []
    for seed in (0, 1):
        graphdef, params = nnx.split(models.Decoder(CFG, rngs=nnx.Rngs(seed)))
        state = state_lib.TrainState.create(graphdef, params, tx, jax.random.PRNGKey(seed))
        states.append(jax.device_put(state, state_lib.state_shardings(mesh, state)))
    return states


def _trajectories(seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(ROWS):
        traj = Trajectory(EpisodeSpec("t", i, i // 4, i % 4 >= 2))
        traj.append(rng.integers(1, 64, 12).tolist(), trained=False)
        traj.append(rng.integers(1, 64, 5).tolist(), trained=True,
                    logprobs=(-rng.uniform(3, 5, 5)).tolist())
        traj.reward = float(rng.integers(0, 2))
        out.append(traj)
    return out


def _extractor_batch(seed, length):
    rng = np.random.default_rng(seed)
    samples = [(Generation(rng.integers(1, 64, 20), rng.integers(1, 64, 6), -rng.uniform(3, 5, 6)),
                float(rng.choice([-1.0, 1.0])), 1.0) for _ in range(3)]
    return generations_batch(samples, length, EXTRACTOR_ROWS, PAD)


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)  # the updater donates its states


def _run(empty_batch, extractor_length):
    """Three updates (with, without, with extractor samples) from the same states."""
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    actor, extractor = _states(mesh)
    updater = Updater(TRAIN, mesh, mesh, max_seq_len=256, empty_extractor_batch=empty_batch)
    history = []
    for step, has_samples in enumerate((True, False, True)):
        before = _copy(extractor.params)
        batch = _extractor_batch(step, extractor_length) if has_samples else None
        actor, extractor, metrics = updater(actor, extractor, _trajectories(step), batch)
        history.append((jax.device_get(actor.params), jax.device_get(extractor.params),
                        jax.device_get(before), metrics))
    return updater, history


def test_a_fixed_extractor_batch_compiles_once_and_updates_alike():
    empty = generations_batch([], EXTRACTOR_LENGTH, EXTRACTOR_ROWS, PAD)
    assert not np.asarray(empty.valid).any() and not np.asarray(empty.loss_mask).any()
    fixed, fixed_history = _run(empty, EXTRACTOR_LENGTH)
    bucketed, bucketed_history = _run(None, 32)
    # One program for every step, against one per extractor shape or none.
    assert len(fixed._step_fns) == 1
    assert len(bucketed._step_fns) == 2
    for (actor_f, ext_f, before_f, m_f), (actor_b, ext_b, _, m_b) in zip(fixed_history,
                                                                       bucketed_history):
        # The same update. The extractor's rows are padded further, so its softmaxes sum over
        # more masked keys, in another order: within 0.2% of an Adam step (about the lr, 1e-2).
        for a, b in zip(jax.tree.leaves(actor_f), jax.tree.leaves(actor_b)):
            np.testing.assert_allclose(a, b, atol=1e-6)
        for a, b in zip(jax.tree.leaves(ext_f), jax.tree.leaves(ext_b)):
            np.testing.assert_allclose(a, b, atol=2e-5)
        assert sorted(m_f) == sorted(m_b)
        np.testing.assert_allclose(m_f["actor/loss"], m_b["actor/loss"], rtol=1e-5)
    # Each update logs the actor batch's length bucket (17 tokens -> 256).
    assert [m["actor/padded_length"] for *_, m in fixed_history] == [256.0] * 3
    # The step without samples: no extractor metrics, and the extractor exactly as it was.
    _, ext_params, before, metrics = fixed_history[1]
    assert not any(k.startswith("extractor/") for k in metrics)
    for a, b in zip(jax.tree.leaves(ext_params), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)
    # The steps with samples did train it.
    _, ext_params, before, metrics = fixed_history[2]
    assert metrics["extractor/no_signal"] == 0.0
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ext_params),
                                                         jax.tree.leaves(before)))
