"""Per-model training state (TrainState), the AdamW optimiser, and the state's shardings.

One TrainState per trained model (the actor, the extractor). It is a pytree of arrays; the static
parts (the model's graphdef and the optax transformation) ride along as non-pytree fields, so a
jitted step takes the state as an argument and never closes over a model object.

The optimiser is the paper's: AdamW with a constant learning rate (1e-6 by default), global-norm
gradient clipping at 1.0 and configurable weight decay (0 in the released config).

Shardings come from the logical-axis names the model put on its parameters (nnx metadata). optax
keeps those Variables (with their metadata) in the Adam moments, so the same rule shards `mu` and
`nu` exactly like the parameters they track; counters are replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crl_jax import sharding


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def problems(self) -> list[str]:
        out = []
        if not self.learning_rate > 0:
            out.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0:
            out.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.max_grad_norm > 0:
            out.append(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            out.append(f"b1 and b2 must be in [0, 1), got {self.b1}, {self.b2}")
        return out


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    problems = cfg.problems()
    if problems:
        raise ValueError("invalid OptimizerConfig:\n  " + "\n  ".join(problems))
    # Clip first: the skip-on-non-finite guard in the train step looks at the raw gradient, and
    # AdamW must see the clipped one, as in Megatron/torch (clip_grad_norm_ then step).
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(cfg.learning_rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay),
    )


@struct.dataclass
class TrainState:
    """step: optimiser updates applied (skipped updates do not count); rng: reserved for stochastic
    training components (the RL losses use none)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)

    @classmethod
    def create(cls, graphdef: nnx.GraphDef, params, tx: optax.GradientTransformation,
               rng: jax.Array | None = None) -> "TrainState":
        rng = jax.random.PRNGKey(0) if rng is None else rng
        return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                   rng=rng, graphdef=graphdef, tx=tx)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(mesh: Mesh, abstract_state: TrainState) -> TrainState:
    """NamedShardings for every leaf of a (possibly abstract) TrainState, as a matching pytree."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def leaf_sharding(x):
        if _is_variable(x):
            axes = x.get_metadata().get("logical_axes")
            return x.replace(value=sharding.logical_sharding(mesh, axes, x.value.shape))
        return replicated

    shard_tree = lambda tree: jax.tree.map(leaf_sharding, tree, is_leaf=_is_variable)  # noqa: E731
    return abstract_state.replace(step=replicated, rng=replicated,
                                  params=shard_tree(abstract_state.params),
                                  opt_state=shard_tree(abstract_state.opt_state))


def create_sharded_state(model_factory, tx: optax.GradientTransformation, mesh: Mesh,
                         seed: int = 0) -> TrainState:
    """Build a TrainState whose params and optimiser state are born sharded on `mesh`.

    `model_factory(rngs)` returns an nnx model. Nothing is materialised unsharded: the state is
    traced with eval_shape, shardings are derived from it, and the initialiser is jitted with them.
    """
    def init():
        graphdef, params = nnx.split(model_factory(nnx.Rngs(seed)))
        return TrainState.create(graphdef, params, tx, jax.random.PRNGKey(seed))

    abstract = jax.eval_shape(init)
    return jax.jit(init, out_shardings=state_shardings(mesh, abstract))()


@jax.jit
def params_checksum(params) -> jax.Array:
    """A scalar fingerprint of a parameter tree (sum over leaves of sum(|x| * (1 + index mod 7))),
    sensitive to both values and positions; used by golden tests."""
    total = jnp.zeros((), jnp.float32)
    for leaf in jax.tree.leaves(params):
        flat = jnp.ravel(leaf).astype(jnp.float32)
        weights = 1.0 + (jnp.arange(flat.size) % 7).astype(jnp.float32)
        total = total + jnp.sum(jnp.abs(flat) * weights)
    return total
