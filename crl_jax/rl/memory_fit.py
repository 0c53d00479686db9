"""Does a compiled step fit in its device's memory? Asked before a run spends any compute.

XLA reports, for a compiled program, the bytes of its arguments, outputs and temporaries
(`memory_analysis`). Their live peak, compared with what one device holds, tells whether the
program can run at all: a run whose update would need 36 GiB on a 24 GiB machine should stop at
start-up with a line naming the setting to change, not with an allocator traceback after the warm
start and the first rollouts.

Device memory: an accelerator's own limit (`memory_stats()["bytes_limit"]`); on a CPU, the
machine's physical memory shared by its local CPU devices (a simulated mesh splits one RAM).
"""

from __future__ import annotations

import os

import jax


def peak_bytes(memory_analysis) -> int:
    """The live peak of a compiled program: arguments + temporaries + outputs + code, less the
    outputs that alias donated arguments (a donated state is updated in place)."""
    m = memory_analysis
    return int(m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
               - m.alias_size_in_bytes + m.generated_code_size_in_bytes)


def device_memory_bytes(device) -> int | None:
    """Bytes one device can hold, or None where that is unknown."""
    stats = None
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
        pass
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        try:
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
        cpus = [d for d in jax.local_devices() if d.platform == "cpu"]
        return int(physical // max(1, len(cpus)))
    return None


def sizing_options(device) -> dict:
    """XLA options for a program compiled only to be measured, never run (the configs' and the
    attention's memory tests). On a CPU, LLVM's optimisation level changes the generated code but
    not XLA's buffer assignment, whose sizes `memory_analysis` reports, and LLVM's passes are
    most of a compile: level 0 gives the same sizes in well under half the time
    (tests/trainer/test_memory_fit.py checks they agree)."""
    return {"xla_backend_optimization_level": 0} if device.platform == "cpu" else {}


def shortfall(compiled, device) -> tuple[int, int] | None:
    """(bytes needed, bytes available) when `compiled` does not fit on `device`, else None."""
    analysis = compiled.memory_analysis()
    available = device_memory_bytes(device)
    if analysis is None or available is None:
        return None
    need = peak_bytes(analysis)
    return (need, available) if need > available else None
