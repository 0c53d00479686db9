"""Multi-host runs: one process per host, started together (`jax.distributed`), one training run.

Design (what each host does, and why the run stays one run):
- **States and the train step live on the global mesh** (every device of every host). The actor and
  extractor TrainStates are global arrays; Orbax saves them collectively; the joint train step is
  one SPMD program whose batch is assembled with `jax.make_array_from_process_local_data`.
- **Rollouts are split by rows** (crl_jax/rollout/collect.py). Of a step's B episodes, host p runs rows
  [p*B/P, (p+1)*B/P) with its own environments and a host-local replica of the actor's params on a
  mesh of its local devices. Each row's sampling keys are folded from its *global* row index
  (`first_row`), so an episode samples the same tokens however the batch is split. After the
  rollout the trajectories are all-gathered, so every host holds the whole step (metrics, the
  reward buffer and the batch are built identically everywhere).
- **The experience bank is replicated, one copy per host, kept identical by ordering:**
  * retrieval for the guided episodes: the hosts all-gather their queries and every host runs the
    same single retrieval over the whole batch (as a 1-process run does);
  * distillation and merges: process 0 is the only writer of extractor text. Its generations are
    broadcast, and every host applies the same operations, in the same order, to its own bank
    (the embedder is deterministic, so the keys agree too);
  * search-and-ask during a rollout reads the host's copy; its "shown" counts are queued and
    replayed on every host after the rollout, in process order;
  * the checkpoint holds the bank once, as a replicated global array.
  Distillation runs inline in multi-host runs (not on a background thread), so that all
  collectives are issued in the same order on every host.
- Only process 0 writes logs, metrics and the report (`metrics.MetricsWriter`, `Trainer.run`).

In a 1-process run none of this is used: `Hosts.create` returns None and the trainer runs as
before.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from crl_jax import sharding
from crl_jax.run import host_exchange

ENV_FLAG = "CRL_JAX_DISTRIBUTED"


def initialize_from_env() -> bool:
    """`jax.distributed.initialize()` when CRL_JAX_DISTRIBUTED=1 (set by launch_tpu.sh).

    On TPU VMs the coordinator and process ids are discovered automatically; elsewhere (e.g. CPU
    processes on one machine) CRL_JAX_COORDINATOR, CRL_JAX_NUM_PROCESSES and CRL_JAX_PROCESS_ID
    name them. Returns whether it initialised.
    """
    if os.environ.get(ENV_FLAG) != "1":
        return False
    kwargs = {}
    if os.environ.get("CRL_JAX_COORDINATOR"):
        try:
            kwargs = dict(coordinator_address=os.environ["CRL_JAX_COORDINATOR"],
                          num_processes=int(os.environ["CRL_JAX_NUM_PROCESSES"]),
                          process_id=int(os.environ["CRL_JAX_PROCESS_ID"]))
        except (KeyError, ValueError) as err:
            raise SystemExit("CRL_JAX_COORDINATOR needs integer CRL_JAX_NUM_PROCESSES and "
                             f"CRL_JAX_PROCESS_ID ({err})") from None
    jax.distributed.initialize(**kwargs)
    return True


def process0_first(fn, name: str):
    """`fn()` on process 0, then on the others once it is done (a shared workdir's one-time builds:
    tokenizer, task splits, converted checkpoints). Just `fn()` in a 1-process run."""
    if jax.process_count() == 1:
        return fn()
    result = fn() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices(f"crl_jax.{name}")
    return result if jax.process_index() == 0 else fn()


def _payload(obj) -> np.ndarray:
    return np.frombuffer(host_exchange.pack(obj), np.uint8)


class Hosts:
    """This process's place in a multi-host run, and the host-to-host exchanges it needs."""

    def __init__(self, global_mesh):
        self.index, self.count = jax.process_index(), jax.process_count()
        self.global_mesh = global_mesh
        tensor = global_mesh.shape["tensor"]
        local = jax.local_devices()
        if len(local) % tensor:
            tensor = 1  # the tensor axis spans hosts; host-local inference shards over fsdp only
        self.local_mesh = sharding.make_mesh((1, -1, tensor), local)
        self._params_cache: dict[str, tuple] = {}

    @classmethod
    def create(cls, global_mesh) -> Hosts | None:
        return cls(global_mesh) if jax.process_count() > 1 else None

    # ---- rows ------------------------------------------------------------------------------
    def share(self, n: int) -> slice:
        """This host's rows of a batch of n episodes."""
        if n % self.count:
            raise ValueError(f"a batch of {n} episodes does not split over {self.count} hosts; make "
                             "rollout.groups_per_step * rollout.group_size a multiple of the host count")
        size = n // self.count
        return slice(self.index * size, (self.index + 1) * size)

    # ---- exchanges -------------------------------------------------------------------------
    def allgather(self, obj) -> list:
        """Every host's `obj` (plain values and host_exchange's records), in process order, on
        every host."""
        data = _payload(obj)
        sizes = multihost_utils.process_allgather(np.int64(data.size))
        padded = np.zeros(int(np.max(sizes)), np.uint8)
        padded[:data.size] = data
        gathered = np.asarray(multihost_utils.process_allgather(padded))
        return [host_exchange.unpack(gathered[p, :int(sizes[p])].tobytes()) for p in range(self.count)]

    def broadcast(self, obj):
        """Process 0's `obj` on every host (other hosts' `obj` is ignored)."""
        data = _payload(obj) if self.index == 0 else np.zeros(0, np.uint8)
        size = int(multihost_utils.broadcast_one_to_all(np.int64(data.size)))
        padded = np.zeros(size, np.uint8)
        padded[:data.size] = data
        return host_exchange.unpack(np.asarray(multihost_utils.broadcast_one_to_all(padded)).tobytes())

    # ---- arrays ----------------------------------------------------------------------------
    def local_params(self, params, role: str):
        """A host-local replica of global params on `local_mesh`, for this host's sampler
        (one all-gather per new set of params; the same params are converted once)."""
        cached = self._params_cache.get(role)
        if cached is not None and cached[0] is params:
            return cached[1]
        from crl_jax.rollout.conversations import shard_params

        replica = shard_params(multihost_utils.process_allgather(params, tiled=True), self.local_mesh)
        self._params_cache[role] = (params, replica)
        return replica

    def global_batch(self, batch, mesh):
        """The global training batch from numpy arrays that every host holds whole: each host
        hands over the rows its devices keep (`make_array_from_process_local_data`)."""
        from crl_jax.rl.batch import batch_shardings

        def place(x, target):
            x = np.asarray(x)
            rows = {idx[0].indices(x.shape[0]) for idx in
                    target.addressable_devices_indices_map(x.shape).values()}
            start, stop = min(r[0] for r in rows), max(r[1] for r in rows)
            if sum(r[1] - r[0] for r in rows) != stop - start:  # not one block: hand over all rows
                start, stop = 0, x.shape[0]
            return jax.make_array_from_process_local_data(target, x[start:stop], x.shape)

        return jax.tree.map(place, batch, batch_shardings(mesh, batch))

    def to_global(self, tree):
        """Host-local arrays, identical on every host, as replicated global arrays (checkpoints)."""
        replicated = NamedSharding(self.global_mesh, PartitionSpec())
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
            replicated, np.asarray(x), x.shape), tree)

    def to_local(self, tree, like):
        """Replicated global arrays back onto the shardings of the host-local tree `like`."""
        return jax.tree.map(lambda x, ref: jax.device_put(np.asarray(x.addressable_data(0)),
                                                          ref.sharding), tree, like)


class WriterExtractor:
    """The extractor client of a multi-host run: distillation and merge generations are made by
    process 0 alone and broadcast; search-and-ask refinements stay host-local (params already a
    host-local replica, seeds salted by host so hosts do not draw identical tokens)."""

    def __init__(self, client, hosts: Hosts):
        self.client, self.hosts = client, hosts

    def __getattr__(self, name):
        return getattr(self.client, name)

    def generate(self, params, conversations, seed: int, kind: str):
        if kind == "refine":
            return self.client.generate(params, conversations, seed=seed + 7919 * self.hosts.index,
                                        kind=kind)
        local = self.hosts.local_params(params, "extractor")  # collective: every host calls it
        replies = (self.client.generate(local, conversations, seed=seed, kind=kind)
                   if self.hosts.index == 0 else None)
        return self.hosts.broadcast(replies)
