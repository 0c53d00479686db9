"""Table rows for benchmarks/run_all.py: one per case, with the figure of each side, their ratio
and the target (if any), built from each benchmark script's JSON lines. Imports no jax, so the
table logic is tested without running benchmarks."""

from __future__ import annotations

import math

GIB = 2**30


def make_row(benchmark: str, case: str, crl_jax, reference, unit: str, ratio=None,
             target: tuple[str, float] | None = None, met=None, notes: str = "") -> dict:
    """A table row. `ratio` defaults to crl_jax / reference; `target` is (">=" or "<=", value)
    on the ratio, and `met` is computed from it unless given (e.g. the compiler's own verdict)."""
    if ratio is None and _finite(crl_jax) and _finite(reference) and reference != 0:
        ratio = crl_jax / reference
    if met is None and target is not None and _finite(ratio):
        op, value = target
        met = ratio >= value if op == ">=" else ratio <= value
    return {"benchmark": benchmark, "case": case, "crl_jax": crl_jax, "reference": reference,
            "unit": unit, "ratio": None if ratio is None else round(float(ratio), 3),
            "target": None if target is None else f"{target[0]} {target[1]:g}",
            "met": met, "notes": notes}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _only(records: list[dict], key: str) -> list[dict]:
    """The records carrying `key`; the script's JSON is the contract, so a missing key is an error
    (it becomes this benchmark's failure line, not a crash of the whole run)."""
    found = [r for r in records if key in r]
    if not found:
        raise ValueError(f"no JSON line with {key!r} in the output")
    return found


def compile_time_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in _only(records, "compile_s_full_depth"):
        rows.append(make_row(
            "compile_time", f"{r['preset']}: {r['layers']} layers vs 2 layers",
            r["compile_s_full_depth"], r["compile_s_2_layers"], "s to compile fwd+bwd",
            ratio=r["ratio"], notes="reference is the same model at 2 layers (scan over layers)"))
    return rows


# Targets (docs/benchmarks.md; sampler: per config; train step: 1.3x PyTorch's tokens/s).
SAMPLER_TARGETS = {"qwen2-7m": 2.0, "smollm2-135m": 1.5}
TRAIN_STEP_TARGET = 1.3
RETRIEVAL_TARGET = 1.0  # at most FAISS's latency


def _malloc(r: dict) -> str:
    """The allocator both sides ran on (figures before 2026-12-07 have no label: system's)."""
    return f"malloc {r.get('malloc', 'system')}"


def sampler_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in _only(records, "crl_jax_tokens_per_s"):
        target = SAMPLER_TARGETS.get(r["config"])
        rows.append(make_row(
            "sampler", f"{r['config']} B={r['batch']} {r['prompt']}+{r['new_tokens']} greedy",
            r["crl_jax_tokens_per_s"], r["transformers_tokens_per_s"], "tokens/s",
            ratio=r["ratio"], target=None if target is None else (">=", target),
            notes=(f"vs transformers (torch {r['torch_threads']} thread(s)); tokens equal "
                   f"{r['tokens_equal_fraction']:.2f}; {r['fraction_of_peak']:.1%} of matmul peak; "
                   f"{_malloc(r)}")))
    return rows


def train_step_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in _only(records, "speedup_vs_torch"):
        rows.append(make_row(
            "train_step", f"{r['preset']} B={r['batch']} T={r['seq']}, {r['steps']} steps",
            r["crl_jax_tokens_per_s"], r["torch_tokens_per_s"], "tokens/s",
            ratio=r["speedup_vs_torch"], target=(">=", TRAIN_STEP_TARGET),
            notes=(f"vs PyTorch eager AdamW, {r['threads']} threads; "
                   f"{r['crl_jax_fraction_of_matmul_peak']:.1%} of matmul peak; step-1 embed diff "
                   f"{r['embed_max_abs_diff_after_step1_in_lr_units']} lr; {_malloc(r)}")))
    return rows


def retrieval_rows(records: list[dict]) -> list[dict]:
    rows = []
    for top in _only(records, "results"):
        for r in top["results"]:
            rows.append(make_row(
                "retrieval", f"bank {r['bank']}, {r['queries']} queries, top-{r['top_k']} + re-rank",
                r["crl_jax_ms"], r["faiss_rerank_ms"], "ms median (lower is better)",
                ratio=r["ratio_crl_jax_over_faiss"], target=("<=", RETRIEVAL_TARGET),
                notes=(f"vs FAISS IndexFlatIP ({r['faiss_threads']} thread(s)) + numpy re-rank; "
                       f"same top-1 {r['same_top1']:.2f}; {_malloc(top)}")))
    return rows


def aot_tpu_rows(records: list[dict]) -> list[dict]:
    """One row per topology tried: peak memory per chip against the chip's HBM; the compiler's
    fit verdict is the target."""
    rows = []
    for r in _only(records, "topology"):
        peak, hbm = r.get("peak_bytes_per_chip"), r.get("hbm_bytes_per_chip")
        note = f"{r.get('compile_s', '?')} s to compile"
        if r.get("error"):
            note += "; " + r["error"][:160]
        case = f"{r.get('program', 'train_step')}, {r['topology']} ({r['chips']} chips)"
        if "actor_seq" in r:
            case += f", actor {r['actor_seq']} / extractor {r['extractor_seq']} tokens"
        rows.append(make_row(
            "aot_tpu", case,
            round(peak / GIB, 2) if peak else None, round(hbm / GIB, 2) if hbm else None,
            "GiB per chip: peak vs HBM", target=("<=", 1.0), met=bool(r.get("fits")),
            notes=note))
    return rows


def envs_rows(records: list[dict]) -> list[dict]:
    """Scripted expert (crl_jax's) against a random agent, per env. No ratio: against a random
    success of 0 it is undefined, and the expert's own success is the figure that matters."""
    rows = []
    for top in _only(records, "rows"):
        for r in top["rows"]:
            row = make_row(
                "envs", f"{r['env']}, {top['seeds']} test seeds",
                round(r["expert_success"], 3), round(r["random_success"], 3),
                "success rate: scripted expert vs random",
                notes=(f"turns {r['expert_turns']:.1f} vs {r['random_turns']:.1f}; "
                       f"{r['steps_per_s']:.0f} env steps/s"))
            row["ratio"] = None
            rows.append(row)
        for name, why in top.get("skipped", []):
            rows.append(make_row("envs", f"{name} (skipped)", None, None, "", notes=why))
    return rows
