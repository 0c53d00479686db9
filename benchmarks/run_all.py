"""Run every benchmark script and write one results table (results.md and results.json).

Each script in benchmarks/ runs crl_jax and a reference side by side (transformers, PyTorch,
FAISS, a random agent, the TPU's HBM) and prints JSON lines. This runs them one after another as
subprocesses, each under a timeout, turns their JSON into table rows (benchmark, case, crl_jax
figure, reference figure, unit, ratio, target, met) and writes benchmarks/results.md and
benchmarks/results.json. A benchmark that fails or times out is recorded with its last stderr line
and the others still run; the exit status is 1 if any failed.

    python benchmarks/run_all.py                       # full sizes
    python benchmarks/run_all.py --quick               # smaller sizes, for a smoke run
    python benchmarks/run_all.py --only sampler,retrieval

With `--only`, the rows of the benchmarks not rerun are kept from the results.json already in
`--out` (when it was made at the same sizes), so the table can be refreshed one benchmark at a
time; each benchmark's line at the end of the table says when it was measured.

The benchmarks import the crl_jax next to this file (PYTHONPATH is set for them), so a checkout's
own code is measured. Nothing here imports jax: the table logic is tested without benchmarks.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # bench_rows sits beside this file, also when it is loaded by path

from bench_rows import (aot_tpu_rows, compile_time_rows, envs_rows, retrieval_rows,  # noqa: E402
                        sampler_rows, train_step_rows)


# ----------------------------------------------------------------------------------------------
# The benchmarks: full and --quick arguments, timeouts, and how their JSON becomes rows.


@dataclasses.dataclass(frozen=True)
class Bench:
    name: str
    script: str  # path relative to the repository root
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    timeout_s: float
    rows: Callable[[list[dict]], list[dict]]

    def argv(self, quick: bool) -> list[str]:
        return [self.script, *(self.quick_args if quick else self.args)]


BENCHMARKS = (
    Bench("compile_time", "benchmarks/compile_time.py", ("--preset=qwen2.5-7b", "--seq=128"),
          ("--preset=qwen2.5-0.5b", "--seq=64"), 1200, compile_time_rows),
    # Both sides on every core: JAX's default, and torch's (one intra-op thread per core). The
    # sampler figures before 2026-12-06 gave torch one thread against JAX's two.
    Bench("sampler", "benchmarks/sampler.py",
          ("--configs=qwen2-7m,smollm2-135m", "--batch=32", "--prompt=128", "--new=128"),
          ("--configs=qwen2-7m", "--batch=8", "--prompt=32", "--new=32"),
          1800, sampler_rows),
    Bench("train_step", "benchmarks/train_step.py",
          ("--preset=tiny", "--batch=8", "--seq=256", "--steps=6"),
          ("--preset=tiny", "--batch=4", "--seq=128", "--steps=3"), 1200, train_step_rows),
    Bench("retrieval", "benchmarks/retrieval.py", ("--sizes=20000x384,100000x1024", "--repeats=10"),
          ("--sizes=20000x384", "--repeats=3"), 1200, retrieval_rows),
    # The paper's lengths (32k actor, 64k extractor): the train step and both samplers, on the
    # smallest v5p and v5e slices tried (docs/tpu.md).
    Bench("aot_tpu", "benchmarks/aot_tpu.py", (),
          ("--actor_seq=2048", "--extractor_seq=2048", "--v5p=2x2x1", "--v5e=4x4",
           "--programs=train_step"),
          1800, aot_tpu_rows),
    Bench("envs", "benchmarks/envs.py", ("--seeds=100", "--json=-"), ("--seeds=10", "--json=-"),
          1800, envs_rows),
)


# ----------------------------------------------------------------------------------------------
# Running: one subprocess per benchmark, progress on stdout, failures recorded.


def display_command(bench: Bench, quick: bool) -> str:
    """The command to rerun one benchmark from the repository root."""
    return shlex.join(["python", *bench.argv(quick)])


def parse_json_lines(stdout: str) -> list[dict]:
    """Every stdout line that is a JSON object (scripts may print tables around them)."""
    records = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                records.append(value)
    return records


def last_line(text: str) -> str:
    """The last line that says something (XLA frames its warnings with lines of asterisks)."""
    lines = [ln.strip() for ln in text.splitlines() if any(c.isalnum() for c in ln)]
    return lines[-1][:300] if lines else ""


def collect(bench: Bench, command: str, returncode: int | None, stdout: str, stderr: str,
            elapsed_s: float, timed_out: bool = False, timeout_s: float | None = None) -> dict:
    """One benchmark's result from its exit status and output: status "ok", "failed" (non-zero
    exit, or output that does not parse into rows) or "timeout"."""
    result = {"name": bench.name, "command": command, "returncode": returncode,
              "elapsed_s": round(elapsed_s, 1), "status": "ok", "error": None, "records": [],
              "rows": []}
    if timed_out:
        limit = bench.timeout_s if timeout_s is None else timeout_s
        result.update(status="timeout", error=f"timed out after {limit:.0f} s; last stderr "
                                               f"line: {last_line(stderr) or '(none)'}")
        return result
    if returncode != 0:
        result.update(status="failed", error=last_line(stderr) or f"exit status {returncode}")
        return result
    result["records"] = parse_json_lines(stdout)
    try:
        result["rows"] = bench.rows(result["records"])
    except (KeyError, TypeError, ValueError) as exc:
        result.update(status="failed", error=f"unreadable output ({type(exc).__name__}: {exc}); "
                                             f"last stderr line: {last_line(stderr)}")
    return result


def run_one(bench: Bench, quick: bool, timeout_s: float | None = None, heartbeat_s: float = 60.0,
            log=print, total_start: float | None = None) -> dict:
    """Run one benchmark script under a timeout; stdout/stderr go to temp files (no pipe can
    fill up), and a progress line is logged every `heartbeat_s`."""
    timeout_s = bench.timeout_s if timeout_s is None else timeout_s
    command = display_command(bench, quick)
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    total_start = time.time() if total_start is None else total_start
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.time()
        # A session of its own, so a timeout kills the benchmark's whole process group.
        proc = subprocess.Popen([sys.executable, *bench.argv(quick)], cwd=ROOT, env=env,
                                stdout=out, stderr=err, start_new_session=True)
        next_beat, timed_out = start + heartbeat_s, False
        while proc.poll() is None:
            now = time.time()
            if now - start > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                timed_out = True
                break
            if now >= next_beat:
                log(f"    ... {bench.name} running {now - start:.0f} s "
                    f"(total {now - total_start:.0f} s)", flush=True)
                next_beat += heartbeat_s
            time.sleep(0.2)
        elapsed = time.time() - start
        out.seek(0)
        err.seek(0)
        return collect(bench, command, proc.returncode, out.read(), err.read(), elapsed, timed_out,
                       timeout_s)


# ----------------------------------------------------------------------------------------------
# Output: markdown table and JSON.


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return str(x)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(results: list[dict], header: dict) -> str:
    """The results table: one row per case; a failed benchmark is one row with its error. The
    command to rerun a benchmark sits in its first row."""
    lines = [
        "# Benchmark results",
        "",
        f"Made by `{header['command']}` on {header['date']} ({header['machine']}). Each command "
        "below reruns one benchmark from the repository root. Ratio is crl_jax / reference "
        "(higher is better for tokens/s, lower for ms and memory); targets are on the ratio.",
        "",
        "| benchmark | case | crl_jax | reference | unit | ratio | target | met | notes | command |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        command = f"`{res['command']}`"
        if res["status"] != "ok":
            lines.append(f"| {res['name']} | **{res['status'].upper()}** after "
                         f"{res['elapsed_s']:.0f} s: {_cell(res['error'])} | - | - | - | - | - | - "
                         f"| | {command} |")
            continue
        if not res["rows"]:
            lines.append(f"| {res['name']} | no rows | - | - | - | - | - | - | | {command} |")
        for i, r in enumerate(res["rows"]):
            lines.append("| " + " | ".join(_cell(c) for c in (
                r["benchmark"], r["case"], _fmt(r["crl_jax"]), _fmt(r["reference"]), r["unit"],
                _fmt(r["ratio"]), _fmt(r["target"]), _fmt(r["met"]), r["notes"])) +
                f" | {command if i == 0 else ''} |")
    failed = [r["name"] for r in results if r["status"] != "ok"]
    times = ", ".join(f"{r['name']} {r['elapsed_s']:.0f} s" for r in results)
    lines += ["", f"Wall time per benchmark: {times}."]
    kept = [r for r in results if r.get("date", header["date"]) != header["date"]]
    if kept:
        lines.append("Kept from earlier runs (not rerun by this command): " + ", ".join(
            f"{r['name']} (measured {r['date']})" for r in kept) + ".")
    if failed:
        lines.append(f"Failed: {', '.join(failed)}.")
    return "\n".join(lines) + "\n"


def summary_json(results: list[dict], header: dict) -> dict:
    return {**header, "failed": [r["name"] for r in results if r["status"] != "ok"],
            "benchmarks": results}


def merge_results(previous: dict | None, fresh: list[dict], quick: bool) -> list[dict]:
    """`fresh` results in place of the same benchmarks' results in `previous` (a results.json
    summary), the others kept, in BENCHMARKS order. A previous table made at the other sizes
    (--quick or not) is not mixed in."""
    if not previous or bool(previous.get("quick")) != bool(quick):
        return fresh
    by_name = {r["name"]: dict(r, date=r.get("date", previous.get("date"))) for r in
               previous.get("benchmarks", [])}
    by_name.update({r["name"]: r for r in fresh})
    order = [b.name for b in BENCHMARKS]
    return sorted(by_name.values(),
                  key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))


def select(only: str | None) -> list[Bench]:
    if not only:
        return list(BENCHMARKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {b.name: b for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def render_only(folder: str) -> int:
    """Rewrite results.md from results.json (e.g. after a change to the table's layout)."""
    with open(os.path.join(folder, "results.json")) as f:
        summary = json.load(f)
    with open(os.path.join(folder, "results.md"), "w") as f:
        f.write(render_markdown(summary["benchmarks"], summary))
    return 1 if summary["failed"] else 0


_VECTOR_EXTENSIONS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("asimd", "ASIMD"))


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model and widest vector extension, e.g. "AMD EPYC (x86_64, AVX2)". Ratios against
    PyTorch move with the CPU (XLA's and PyTorch's CPU kernels are tuned differently per vector
    width), so a results table names the machine it was measured on."""
    arch, model, flags = platform.machine(), None, set()
    try:
        with open(cpuinfo) as f:
            for line in f:  # one block per core, all alike: the first model name and flags do
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "model name" and model is None:
                    model = value
                elif key in ("flags", "Features") and not flags:  # x86, Arm
                    flags = set(value.split())
    except OSError:  # not Linux: the architecture alone
        return arch
    isa = next((label for flag, label in _VECTOR_EXTENSIONS if flag in flags), None)
    return f"{model or arch} ({arch}, {isa})" if isa else f"{model or arch} ({arch})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated benchmark names")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per benchmark (default: each benchmark's own)")
    parser.add_argument("--out", default=HERE, help="folder for results.md and results.json")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite results.md from the results.json in --out")
    args = parser.parse_args(argv)
    if args.render:
        return render_only(args.out)
    benches = select(args.only)
    own = ["python", "benchmarks/run_all.py"] + (sys.argv[1:] if argv is None else list(argv))
    header = {"command": shlex.join(own), "quick": args.quick,
              "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
              "machine": f"{os.cpu_count()} CPUs, {cpu_description()}, Python "
                         f"{platform.python_version()}",
              "xla_flags": os.environ.get("XLA_FLAGS", "")}
    results, total_start = [], time.time()
    for i, bench in enumerate(benches, 1):
        timeout = bench.timeout_s if args.timeout is None else args.timeout
        print(f"[{i}/{len(benches)}] {bench.name}: {display_command(bench, args.quick)} "
              f"(timeout {timeout:.0f} s, total {time.time() - total_start:.0f} s)", flush=True)
        res = dict(run_one(bench, args.quick, timeout, total_start=total_start),
                   date=header["date"])
        results.append(res)
        if res["status"] == "ok":
            print(f"    ok in {res['elapsed_s']:.0f} s, {len(res['rows'])} row(s)", flush=True)
        else:
            print(f"    {res['status'].upper()} in {res['elapsed_s']:.0f} s: {res['error']}",
                  flush=True)
    failed = [r["name"] for r in results if r["status"] != "ok"]
    os.makedirs(args.out, exist_ok=True)
    previous_path = os.path.join(args.out, "results.json")
    if args.only and os.path.exists(previous_path):
        with open(previous_path) as f:
            results = merge_results(json.load(f), results, args.quick)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render_markdown(results, header))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(summary_json(results, header), f, indent=1)
    print(f"done in {time.time() - total_start:.0f} s; wrote results.md and results.json"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
