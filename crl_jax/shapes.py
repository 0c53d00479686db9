"""Padded sizes for jitted calls. A jitted function compiles once per input shape, so batch sizes
and sequence lengths are rounded up to a few buckets; these are the project's two roundings."""


def pow2_bucket(n: int, least: int = 1) -> int:
    """The smallest power of two >= n, and at least `least` (batch sizes, chunk lengths)."""
    return max(least, 1 << max(0, n - 1).bit_length())


def length_bucket(n: int, cap: int, granule: int = 256) -> int:
    """The padded length for a sequence of `n` tokens: the next multiple of `granule`, at most
    `cap`. Coarse enough that a run compiles each step for a handful of shapes only."""
    return min(max(granule, -(-n // granule) * granule), cap)
