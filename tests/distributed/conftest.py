"""The trainer tests' fixtures (tiny config, shared compilation cache, the test/coin env)."""

from tests.trainer.conftest import compile_cache, make_config  # noqa: F401
