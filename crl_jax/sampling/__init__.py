"""crl_jax.sampling."""
