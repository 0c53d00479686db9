"""Long-context actor update on CPU: blockwise attention against the materialised reference.

Both sides are crl_jax's jitted train_step on the same decoder preset and batch, differing only in
`DecoderConfig.attention`. For each: the temporaries XLA's memory analysis reports for the compiled
step (the issue's memory criterion), and the median step time over alternated repetitions. The
matmul peak is measured in the same run (benchmarks/train_step.py), and each side's analytic
training FLOPs (causal attention counted whole, as both compute about half of it) are divided by
it. Prints one JSON line.

Both sides run the MLP in time chunks of `--mlp_chunk` tokens (DecoderConfig.mlp_chunk), as a
long-sequence update would; `whole_mlp_temp_ratio` is the memory ratio with the MLP whole.

  python benchmarks/attention.py                       # tiny preset, one sequence of 4,096 tokens
  python benchmarks/attention.py --seq=8192 --steps=3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from flax import nnx  # noqa: E402

import train_step as train_bench  # noqa: E402
from crl_jax import models, sharding  # noqa: E402
from crl_jax.rl import batch as batch_lib  # noqa: E402
from crl_jax.rl import state as state_lib  # noqa: E402
from crl_jax.rl import train_step as ts  # noqa: E402

GIB = 2**30


def build(preset: str, implementation: str, remat: str, mlp_chunk: int, batch, mesh):
    cfg = models.get_preset(preset, attention=implementation, remat=remat, mlp_chunk=mlp_chunk)
    graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
    state = state_lib.TrainState.create(graphdef, params, state_lib.make_optimizer(
        state_lib.OptimizerConfig(learning_rate=train_bench.LR)))
    step = ts.make_train_step(ts.TrainConfig(), mesh, state, None, batch)
    compiled = step.lower(state, None, batch).compile()
    return cfg, state, compiled


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--remat", default="none")
    p.add_argument("--mlp_chunk", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    cfg = models.get_preset(args.preset)
    batch = batch_lib.TrainBatch(jax.device_put(train_bench.make_batch(cfg, args.batch, args.seq)), None)
    sides = {}
    for name in ("blockwise", "materialized"):
        t = time.perf_counter()
        cfg, state, compiled = build(args.preset, name, args.remat, args.mlp_chunk, batch, mesh)
        sides[name] = dict(state=state, step=compiled, times=[], compile_s=time.perf_counter() - t,
                           temp=compiled.memory_analysis().temp_size_in_bytes)
    for _ in range(args.steps + 1):  # the first round warms up
        for side in sides.values():
            t = time.perf_counter()
            side["state"], _, _ = side["step"](side["state"], None, batch)
            jax.block_until_ready(side["state"].params)
            side["times"].append(time.perf_counter() - t)
    peak = train_bench.matmul_peak_flops()
    flops = train_bench.training_flops(cfg, args.batch, args.seq)
    out = {"benchmark": "long_context_attention", "backend": jax.default_backend(),
           "preset": args.preset, "batch": args.batch, "seq": args.seq, "remat": args.remat,
           "mlp_chunk": args.mlp_chunk, "steps": args.steps, "threads": os.cpu_count(),
           "matmul_peak_gflops": round(peak / 1e9, 1)}
    for name, side in sides.items():
        median = statistics.median(side["times"][1:])
        out[f"{name}_temp_gib"] = round(side["temp"] / GIB, 3)
        out[f"{name}_tokens_per_s"] = round(args.batch * args.seq / median, 1)
        out[f"{name}_fraction_of_matmul_peak"] = round(flops / median / peak, 3)
        out[f"{name}_compile_s"] = round(side["compile_s"], 1)
    out["temp_ratio"] = round(sides["blockwise"]["temp"] / sides["materialized"]["temp"], 3)
    whole = [build(args.preset, name, args.remat, 0, batch, mesh)[2].memory_analysis().temp_size_in_bytes
             for name in ("blockwise", "materialized")]
    out["whole_mlp_temp_ratio"] = round(whole[0] / whole[1], 3)
    out["speed_ratio"] = round(out["blockwise_tokens_per_s"] / out["materialized_tokens_per_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
