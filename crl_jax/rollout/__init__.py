"""crl_jax.rollout."""
