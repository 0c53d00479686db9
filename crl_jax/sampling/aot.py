"""Ahead-of-time compilation of the rollout sampler for a TPU topology, without a TPU.

One `engine.generate` call, the program the rollouts run: a prefill of a padded chunk of
`prompt_len` tokens per row into a KV cache of `cache_length` slots, then the decode loop for up
to `max_new_tokens` tokens. Weights and cache are born sharded as in a run (weights by the
logical-axis rules, the cache's batch over data/fsdp and kv heads over tensor), and the compiled
program's memory analysis gives the per-chip peak. Nothing is allocated or run.

Legend: B rows, P prompt (chunk) tokens, S cache slots, N new tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from crl_jax import models, sharding
from crl_jax.rl import aot as rl_aot
from crl_jax.rl import memory_fit
from crl_jax.sampling import engine
from crl_jax.sampling.spec import SamplerSpec


def abstract_params(cfg: models.DecoderConfig):
    """(graphdef, params as ShapeDtypeStructs-in-Variables) of a decoder: nothing is allocated."""
    graphdef, params = jax.eval_shape(lambda: nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0))))
    return graphdef, params


def compile_generate(cfg: models.DecoderConfig, mesh, batch: int, prompt_len: int,
                     cache_length: int, max_new_tokens: int):
    """The sampler's prefill + decode program compiled on `mesh` for these shapes."""
    graphdef, params = abstract_params(cfg)
    param_sh = jax.tree.map(
        lambda v: sharding.logical_sharding(mesh, v.get_metadata().get("logical_axes"), v.value.shape),
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    spec = SamplerSpec(method="sample", temperature=1.0, max_new_tokens=max_new_tokens,
                       cache_length=cache_length)
    state = jax.eval_shape(lambda: engine.init_state(cfg, batch, spec))
    state_sh = engine.state_shardings(mesh, state)
    rows = sharding.logical_sharding(mesh, ("batch", None), (batch, prompt_len))
    flags = sharding.logical_sharding(mesh, ("batch",), (batch,))
    chunk = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, prompt_len), jnp.bool_)
    flag = jax.ShapeDtypeStruct((batch,), jnp.bool_)
    fn = jax.jit(functools.partial(engine.generate, graphdef, spec=spec, mesh=mesh),
                 in_shardings=(param_sh, state_sh, rows, rows, flags, flags),
                 out_shardings=(state_sh, NamedSharding(mesh, PartitionSpec())),
                 donate_argnums=(1,))
    with jax.set_mesh(mesh):
        return fn.lower(params, state, chunk, mask, flag, flag).compile()


def compile_sampler(cfg: models.DecoderConfig, topology: str, mesh_shape, batch: int,
                    prompt_len: int, cache_length: int, max_new_tokens: int) -> dict:
    """Compile the sampler for `topology`; per-chip memory (bytes) and FLOPs, as
    crl_jax.rl.aot.compile_train_step reports them."""
    mesh = rl_aot.topology_mesh(topology, mesh_shape)
    compiled = compile_generate(cfg, mesh, batch, prompt_len, cache_length, max_new_tokens)
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    peak = memory_fit.peak_bytes(mem)
    hbm = rl_aot.HBM_GIB.get(topology.split(":")[0].lower(), float("nan")) * 2**30
    return {"topology": topology, "chips": mesh.devices.size,
            "mesh": dict(zip(mesh.axis_names, mesh.devices.shape)),
            "argument_bytes": mem.argument_size_in_bytes, "temp_bytes": mem.temp_size_in_bytes,
            "peak_bytes_per_chip": peak, "hbm_bytes_per_chip": hbm, "fits": bool(peak <= hbm),
            "flops_per_chip": float(cost.get("flops", float("nan")))}
