"""crl_jax.memory."""
