"""crl_jax.rl."""
