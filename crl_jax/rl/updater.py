"""The RL update of one step, from the host: batches padded to length buckets, the jitted train
step compiled once per batch shape, and states in, new states out.

Colocated roles run the joint train step (actor and extractor in one program). Disjoint role
meshes (crl_jax/roles.py) run one step per role, each the joint step restricted to one model, so
the result equals the colocated update. A multi-host run assembles the global batch from the
copies every host holds, and pads to the full length so every host builds the same shapes.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import NamedSharding, PartitionSpec

from crl_jax.config import ConfigError
from crl_jax.rl import aot, memory_fit
from crl_jax.rl.batch import TrainBatch, batch_shardings
from crl_jax.rl.state import state_shardings
from crl_jax.rl.train_step import TrainConfig, make_train_step, train_step
from crl_jax.rollout.trajectory import to_policy_batch
from crl_jax.shapes import length_bucket


def make_extractor_step(cfg: TrainConfig, mesh, extractor_state, extractor_batch):
    """The joint train step restricted to the extractor, jitted on the extractor's mesh."""
    cfg = dataclasses.replace(cfg, update_actor=False)

    def step(state, batch):
        _, state, metrics = train_step(None, state, TrainBatch(None, batch), cfg=cfg)
        return state, metrics

    state_sh = state_shardings(mesh, extractor_state)
    batch_sh = batch_shardings(mesh, extractor_batch)
    return jax.jit(step, in_shardings=(state_sh, batch_sh),
                   out_shardings=(state_sh, NamedSharding(mesh, PartitionSpec())), donate_argnums=(0,))


class Updater:
    def __init__(self, cfg: TrainConfig, mesh, extractor_mesh, max_seq_len: int, hosts=None,
                 empty_extractor_batch=None):
        """`empty_extractor_batch`: an extractor batch with no valid row, of the one shape every
        extractor batch then has; colocated updates without an extractor batch carry it instead,
        so that the joint step's shape no longer depends on whether the extractor has samples.
        Its gradient is zero, and the step applies no zero gradient: the extractor's state is
        unchanged, and its metrics are dropped."""
        self.cfg, self.mesh, self.extractor_mesh = cfg, mesh, extractor_mesh
        self.max_seq_len, self.hosts = max_seq_len, hosts
        self.empty_extractor_batch = empty_extractor_batch
        self._step_fns: dict = {}

    @property
    def colocated(self) -> bool:
        return self.extractor_mesh is self.mesh

    @property
    def fills_missing_extractor_batch(self) -> bool:
        """Whether an update without an extractor batch carries the empty one, and so takes (and
        donates) the extractor's state as well."""
        return self.colocated and self.empty_extractor_batch is not None

    def __call__(self, actor_state, extractor_state, trajectories, extractor_batch):
        """(actor state, extractor state, metrics) after one update on this step's episodes and,
        if given, the extractor's batch. The states passed in are donated."""
        # Pad to a length bucket, not to max_seq_len: short episodes train at a fraction of the
        # cost, and the few bucket shapes each compile once.
        longest = max(len(t.tokens) for t in trajectories)
        length = self.max_seq_len if self.hosts else length_bucket(longest, self.max_seq_len)
        actor_batch = to_policy_batch(trajectories, length)
        if not self.colocated:
            actor_state, extractor_state, metrics = self._split(actor_state, extractor_state,
                                                                actor_batch, extractor_batch)
            return actor_state, extractor_state, self._with_length(metrics, length)
        placeholder = extractor_batch is None and self.fills_missing_extractor_batch
        if placeholder:
            extractor_batch = self.empty_extractor_batch
        batch = TrainBatch(actor_batch, extractor_batch)
        if self.hosts:
            batch = self.hosts.global_batch(batch, self.mesh)
        key = (actor_batch.tokens.shape, None if extractor_batch is None else extractor_batch.tokens.shape)
        if key not in self._step_fns:
            self._step_fns[key] = make_train_step(self.cfg, self.mesh, actor_state, extractor_state, batch)
        actor_state, extractor_state, metrics = self._step_fns[key](actor_state, extractor_state, batch)
        metrics = _floats(metrics)
        if placeholder:
            metrics = {k: v for k, v in metrics.items() if not k.startswith("extractor/")}
        return actor_state, extractor_state, self._with_length(metrics, length)

    def _with_length(self, metrics: dict, length: int) -> dict:
        """The actor batch's padded length, which sets the update's program and cost."""
        return {**metrics, "actor/padded_length": float(length)} if self.cfg.update_actor else metrics

    def _split(self, actor_state, extractor_state, actor_batch, extractor_batch):
        """One update with disjoint role meshes: the actor's step on its mesh, the extractor's on
        its own."""
        fns, metrics = self._step_fns, {}
        if self.cfg.update_actor:
            batch = TrainBatch(actor_batch)
            if "actor" not in fns:
                fns["actor"] = make_train_step(self.cfg, self.mesh, actor_state, None, batch)
            actor_state, _, actor_metrics = fns["actor"](actor_state, None, batch)
            metrics.update(actor_metrics)
        if extractor_batch is not None:
            if "extractor" not in fns:
                fns["extractor"] = make_extractor_step(self.cfg, self.extractor_mesh, extractor_state,
                                                       extractor_batch)
            extractor_state, ext_metrics = fns["extractor"](extractor_state, extractor_batch)
            metrics.update(ext_metrics)  # already named "extractor/..."
        return actor_state, extractor_state, _floats(metrics)

    def check_fits(self, actor_state, extractor_state, rows: int, micro_batches: int,
                   extractor_shape: tuple[int, int] | None) -> None:
        """Compile the update at its largest shapes (abstract inputs: nothing is allocated or run)
        and raise a ConfigError if it cannot fit on one device, so an oversized run stops here
        rather than at its first update, after the warm start. Checked for the colocated
        single-host update; role-split and multi-host updates compile per role and host."""
        if self.hosts or not self.colocated:
            return
        # Compiled as the run compiles it (not with memory_fit.sizing_options, which would halve
        # this on a CPU): through the persistent compile cache, the run's first update at these
        # shapes then loads this program instead of compiling it again.
        compiled = aot.compile_update(self.cfg, self.mesh, actor_state, extractor_state,
                                      (rows, self.max_seq_len), extractor_shape)
        short = memory_fit.shortfall(compiled, self.mesh.devices.flat[0])
        if short:
            need, have = (b / 2**30 for b in short)
            raise ConfigError([
                f"rl.micro_batches: the update of {rows} actor sequences x {self.max_seq_len} "
                f"tokens (rl.max_seq_len) needs {need:.1f} GiB on one device, which holds "
                f"{have:.1f} GiB; raise rl.micro_batches (now {micro_batches}; it must "
                f"divide {rows}) or lower rl.max_seq_len"])


def _floats(metrics) -> dict[str, float]:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}
