"""Size TPU slices for the paper-scale joint train step by AOT compilation, without a TPU.

Compiles crl_jax's joint train_step (Qwen2.5-7B actor + Qwen3-4B extractor, bf16 compute with
float32 master weights and AdamW moments, full layer remat, chunked LM head, micro-batched at one
sequence per batch shard) for TPU topologies through libtpu's compile-only client, and prints per
chip: memory from `memory_analysis()`, FLOPs from `cost_analysis()`, and for each family (v5p,
v5e) the smallest slice tried on which it fits. A slice on which the program does not fit shows
the compiler's own out-of-memory line.

XLA's cost analysis counts the body of a while loop once (layers, micro-batches and LM-head chunks
are loops here), so an analytic per-chip FLOP count of one optimiser step is printed beside it.

  python benchmarks/aot_tpu.py                                  # paper lengths: 32k actor, 64k extractor
  python benchmarks/aot_tpu.py --actor_seq=8192 --extractor_seq=8192 --v5p=2x2x1 --v5e=4x4,4x8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from crl_jax import models  # noqa: E402
from crl_jax.rl import aot  # noqa: E402
from crl_jax.rl import train_step as ts  # noqa: E402

GIB = 2**30


def step_flops(cfg, batch: int, seq: int) -> float:
    """Analytic FLOPs of one update: forward + backward (3x) + one more forward for full remat,
    i.e. 8 x matmul params x tokens, plus causal attention (2 B T^2 N H per layer per pass)."""
    d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                     cfg.head_dim)
    layer = 2 * d * n * h + 2 * d * k * h + 3 * d * f
    tokens = batch * seq
    # The LM head is rematerialised by its own chunked checkpoint: also 4 passes.
    matmul = 2 * (cfg.num_layers * layer + d * cfg.vocab_size) * tokens * 4
    attention = cfg.num_layers * 4 * batch * seq * seq * n * h * 4
    return float(matmul + attention)


def spec_for(args, shards: int) -> aot.AotSpec:
    """One sequence per batch shard per micro-batch: the paper's per-device micro-batch of 1."""
    common = dict(dtype="bfloat16", param_dtype="float32", remat="full", attention=args.attention)
    actor = models.get_preset("qwen2.5-7b", **common)
    extractor = models.get_preset("qwen3-4b", **common)
    train = ts.TrainConfig(actor_micro_batches=max(1, args.actor_batch // shards),
                           extractor_micro_batches=max(1, args.extractor_batch // shards),
                           logprob_chunk=args.logprob_chunk)
    return aot.AotSpec(actor, extractor, args.actor_batch, args.actor_seq, args.extractor_batch,
                       args.extractor_seq, train=train)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actor_seq", type=int, default=32768)
    p.add_argument("--extractor_seq", type=int, default=65536)
    p.add_argument("--actor_batch", type=int, default=128)
    p.add_argument("--extractor_batch", type=int, default=64)
    p.add_argument("--logprob_chunk", type=int, default=2048)
    p.add_argument("--attention", default="splash", choices=("splash", "blockwise", "materialized"),
                   help="the decoders' attention (crl_jax.models.attention)")
    p.add_argument("--tensor", type=int, default=4, help="tensor-parallel width (heads, MLP)")
    p.add_argument("--v5p", default="2x2x1,2x2x2,2x2x4", help="v5p topologies, ascending")
    p.add_argument("--v5e", default="4x4,4x8,8x8", help="v5e topologies, ascending")
    args = p.parse_args()

    rows = []
    for family in ("v5p", "v5e"):
        smallest = None
        for shape in filter(None, getattr(args, family).split(",")):
            topology = f"{family}:{shape}"
            chips = 1
            for s in shape.split("x"):
                chips *= int(s)
            mesh_shape = (1, chips // args.tensor, args.tensor)
            spec = spec_for(args, chips // args.tensor)
            t = time.time()
            try:
                row = aot.compile_train_step(spec, topology, mesh_shape)
                row["error"] = None
            except Exception as e:  # the compiler's out-of-memory verdict is a result here
                msg = str(e)
                oom = re.search(r"(Ran out of memory|RESOURCE_EXHAUSTED)[^\n]*", msg)
                row = {"topology": topology, "chips": chips, "fits": False,
                       "error": (oom.group(0) if oom else msg.splitlines()[0])[:400]}
            row["compile_s"] = round(time.time() - t, 1)
            per_chip = (step_flops(spec.actor, args.actor_batch, args.actor_seq)
                        + step_flops(spec.extractor, args.extractor_batch, args.extractor_seq)) / chips
            row["analytic_flops_per_chip"] = per_chip
            row["actor_seq"], row["extractor_seq"] = args.actor_seq, args.extractor_seq
            rows.append(row)
            print(json.dumps(row), flush=True)
            if row["fits"]:
                smallest = topology
                break
        print(json.dumps({"family": family, "smallest_fitting_slice_tried": smallest}), flush=True)

    print(f"\n{'topology':<12}{'chips':>6}{'peak GiB/chip':>15}{'HBM GiB':>9}{'fits':>6}"
          f"{'XLA flops/chip':>16}{'analytic flops/chip':>21}")
    for r in rows:
        peak = r.get("peak_bytes_per_chip")
        peak_s = f"{peak / GIB:.1f}" if peak else "-"
        hbm_s = f"{r['hbm_bytes_per_chip'] / GIB:.0f}" if peak else "-"
        print(f"{r['topology']:<12}{r['chips']:>6}{peak_s:>15}{hbm_s:>9}{str(r['fits']):>6}"
              f"{r.get('flops_per_chip', float('nan')):>16.3e}"
              f"{r['analytic_flops_per_chip']:>21.3e}")
        if r.get("error"):
            print(f"    {r['error']}")


if __name__ == "__main__":
    main()
