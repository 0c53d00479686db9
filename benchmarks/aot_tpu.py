"""Size TPU slices for the paper's whole loop by AOT compilation, without a TPU.

Three programs: the joint train step, the actor's rollout sampler and the extractor's sampler.
The train step is crl_jax's joint train_step (Qwen2.5-7B actor + Qwen3-4B extractor, bf16 compute with
float32 master weights and AdamW moments, full layer remat, chunked LM head, micro-batched at one
sequence per batch shard) for TPU topologies through libtpu's compile-only client, and prints per
chip: memory from `memory_analysis()`, FLOPs from `cost_analysis()`, and for each family (v5p,
v5e) the smallest slice tried on which it fits. A slice on which the program does not fit shows
the compiler's own out-of-memory line. The samplers are one `generate` call each (prefill of a
padded chunk into the KV cache, then decoding; crl_jax/sampling/aot.py): the actor's 128 rollouts
(16 groups x 8) with a 2,048-token prompt, 4,096 new tokens and a 32,768-slot cache; the
extractor's 16 distillations of a 32,768-token prompt (a whole episode), 8,192 new tokens and a
65,536-slot cache. Weights bf16, the cache sharded like a run's.

XLA's cost analysis counts the body of a while loop once (layers, micro-batches and LM-head chunks
are loops here), so an analytic per-chip FLOP count of one optimiser step is printed beside it.

  python benchmarks/aot_tpu.py                                  # paper lengths: 32k actor, 64k extractor
  python benchmarks/aot_tpu.py --actor_seq=8192 --extractor_seq=8192 --v5p=2x2x1 --v5e=4x4,4x8
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from crl_jax import models  # noqa: E402
from crl_jax.rl import aot  # noqa: E402
from crl_jax.rl import train_step as ts  # noqa: E402
from crl_jax.sampling import aot as sampler_aot  # noqa: E402

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
    common = dict(dtype="bfloat16", param_dtype="float32", remat="full", attention=args.attention,
                  context_parallel=args.context_parallel)
    actor = models.get_preset("qwen2.5-7b", **common)
    extractor = models.get_preset("qwen3-4b", **common)
    # With context parallelism one sequence per micro-batch, split along T over the fsdp shards.
    per_micro = 1 if args.context_parallel else shards
    train = ts.TrainConfig(actor_micro_batches=max(1, args.actor_batch // per_micro),
                           extractor_micro_batches=max(1, args.extractor_batch // per_micro),
                           logprob_chunk=args.logprob_chunk, context_parallel=args.context_parallel)
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
    p.add_argument("--rollouts", type=int, default=128, help="actor sampler rows (16 groups x 8)")
    p.add_argument("--prompt", type=int, default=2048, help="actor prompt tokens (first prefill)")
    p.add_argument("--actor_new", type=int, default=4096, help="actor tokens per turn")
    p.add_argument("--distillations", type=int, default=16, help="extractor sampler rows")
    p.add_argument("--extractor_prompt", type=int, default=32768,
                   help="extractor prompt tokens: a whole actor episode and the instructions")
    p.add_argument("--extractor_new", type=int, default=8192)
    p.add_argument("--context_parallel", action=argparse.BooleanOptionalAction, default=True,
                   help="split each sequence along T over the fsdp chips, one sequence per "
                        "micro-batch (a no-op where fsdp is 1)")
    p.add_argument("--programs", default="train_step,actor_sampler,extractor_sampler")
    p.add_argument("--tensor", type=int, default=4, help="tensor-parallel width (heads, MLP)")
    p.add_argument("--v5p", default="2x2x1,2x2x2,2x2x4", help="v5p topologies, ascending")
    p.add_argument("--v5e", default="4x4,4x8,8x8", help="v5e topologies, ascending")
    args = p.parse_args()

    sampler_shapes = {  # (model, rows, prompt tokens, cache slots, new tokens)
        "actor_sampler": ("qwen2.5-7b", args.rollouts, args.prompt, args.actor_seq, args.actor_new),
        "extractor_sampler": ("qwen3-4b", args.distillations, args.extractor_prompt,
                              args.extractor_seq, args.extractor_new),
    }
    programs = {"train_step": lambda topology, chips, mesh_shape: aot.compile_train_step(
        spec_for(args, chips // args.tensor), topology, mesh_shape)}
    for name, (preset, rows_, prompt, cache, new) in sampler_shapes.items():
        cfg = models.get_preset(preset, dtype="bfloat16", param_dtype="bfloat16",
                                attention="auto" if args.attention == "splash" else args.attention)
        programs[name] = functools.partial(_sampler, cfg, rows_, prompt, cache, new)

    rows, summary = [], {}
    for program in args.programs.split(","):
        compile_fn = programs[program]
        for family in ("v5p", "v5e"):
            smallest = None
            for shape in filter(None, getattr(args, family).split(",")):
                topology = f"{family}:{shape}"
                chips = 1
                for s in shape.split("x"):
                    chips *= int(s)
                mesh_shape = (1, chips // args.tensor, args.tensor)
                t = time.time()
                try:
                    row = compile_fn(topology, chips, mesh_shape)
                    row["error"] = None
                except Exception as e:  # the compiler's out-of-memory verdict is a result here
                    msg = str(e)
                    oom = re.search(r"(Ran out of memory|RESOURCE_EXHAUSTED)[^\n]*", msg)
                    row = {"topology": topology, "chips": chips, "fits": False,
                           "error": (oom.group(0) if oom else msg.splitlines()[0])[:400]}
                row["program"], row["compile_s"] = program, round(time.time() - t, 1)
                if program == "train_step":
                    spec = spec_for(args, chips // args.tensor)
                    row["analytic_flops_per_chip"] = (
                        step_flops(spec.actor, args.actor_batch, args.actor_seq)
                        + step_flops(spec.extractor, args.extractor_batch, args.extractor_seq)) / chips
                    row["actor_seq"], row["extractor_seq"] = args.actor_seq, args.extractor_seq
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["fits"]:
                    smallest = topology
                    break
            print(json.dumps({"program": program, "family": family,
                              "smallest_fitting_slice_tried": smallest}), flush=True)
            summary.setdefault(program, {})[family] = smallest

    print(f"\n{'program':<19}{'topology':<12}{'chips':>6}{'peak GiB/chip':>15}{'HBM GiB':>9}"
          f"{'fits':>6}{'XLA flops/chip':>16}")
    for r in rows:
        peak = r.get("peak_bytes_per_chip")
        peak_s = f"{peak / GIB:.1f}" if peak else "-"
        hbm_s = f"{r['hbm_bytes_per_chip'] / GIB:.0f}" if peak else "-"
        print(f"{r['program']:<19}{r['topology']:<12}{r['chips']:>6}{peak_s:>15}{hbm_s:>9}"
              f"{str(r['fits']):>6}{r.get('flops_per_chip', float('nan')):>16.3e}")
        if r.get("error"):
            print(f"    {r['error']}")
    print(json.dumps({"benchmark": "aot_tpu", "actor_seq": args.actor_seq,
                      "extractor_seq": args.extractor_seq, "attention": args.attention,
                      "context_parallel": args.context_parallel, "tensor": args.tensor,
                      "smallest_fitting_slice": summary}))


def _sampler(cfg, rows, prompt, cache, new, topology, chips, mesh_shape):
    return sampler_aot.compile_sampler(cfg, topology, mesh_shape, rows, prompt, cache, new)


if __name__ == "__main__":
    main()
