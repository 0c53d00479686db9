"""A persistent XLA compilation cache for runs: a rerun (another seed, a variant, a resumed run)
loads the programs an earlier run on this machine compiled instead of compiling them again. On a
CPU a run compiles dozens of programs (the sampler's for each chunk length and cache capacity,
the update's for each length bucket), a large share of a short run's time.

JAX keys each entry by the program, the backend and the JAX and XLA versions, so an entry is loaded
only by the setup it was made for; JAX_COMPILATION_CACHE_DIR, where set (a grid launcher's shared
cache, the tests'), takes precedence over `--compile_cache`.
"""

from __future__ import annotations

import logging
import os

# Past this size JAX evicts the least recently used entries (and locks the folder, so that runs
# sharing it do not collide).
MAX_BYTES = 4 * 2**30

log = logging.getLogger("crl_jax")


def default_dir() -> str:
    """$XDG_CACHE_HOME/crl_jax/jax_cache, or ~/.cache/crl_jax/jax_cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "crl_jax", "jax_cache")


def enable(directory: str) -> str | None:
    """Cache compiled programs in `directory` ("" turns the cache off); returns the folder in use.
    A local folder that cannot be created leaves the cache off, with a warning: a run does not
    need it."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    if not directory:
        return None
    if "://" not in directory:  # remote folders (gs://...) exist without being made
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as err:
            log.warning("compilation cache off: cannot create %s (%s)", directory, err.strerror or err)
            return None
    import jax  # here, so that reading the default folder (for --help) does not load JAX

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return directory
