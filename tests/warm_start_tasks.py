"""Shared by the warm-start tests: the two task families they draw demonstrations from, and a
nano actor state to train on them."""

from crl_jax import envs, models, sharding
from crl_jax.rl.state import OptimizerConfig, create_sharded_state, make_optimizer
from crl_jax.warm_start import demos

TASK = "sokoban/6x6-2box"   # a real environment: fast to reset, has a scripted expert
SHORT = "test/corridor"     # short prompts, so the JAX tests compile one small shape
envs.register(SHORT, "tests.corridor_env", "CorridorEnv")


def short_demos(n=8):
    """Scripted and random demonstrations of n corridor seeds."""
    tasks = [{"env": SHORT, "seed": s} for s in range(n)]
    return demos.collect_demos(tasks, max_turns=4, epsilons=(0.0, 1.0), guided_fraction=0.0,
                               search_fraction=0.0, tools=False, seed=0)


def nano_state(vocab, seed=0, lr=1e-2):
    """(mesh, train state) of the nano preset sized to `vocab`'s tokenizer."""
    cfg = models.get_preset("nano", vocab_size=vocab.vocab_size, eos_token_id=vocab.eos_id,
                            pad_token_id=vocab.pad_id)
    mesh = sharding.make_mesh((1, -1, 1))
    tx = make_optimizer(OptimizerConfig(learning_rate=lr))
    return mesh, create_sharded_state(lambda rngs: models.Decoder(cfg, rngs=rngs), tx, mesh, seed)
