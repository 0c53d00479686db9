"""crl_jax.data."""
