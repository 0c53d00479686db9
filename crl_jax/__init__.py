"""crl_jax: Complementary RL (arXiv 2603.17621) in JAX.

An LLM actor trained by subgroup GRPO co-evolves with an LLM experience extractor trained by CISPO
on whether the experience-bank entries it wrote helped the actor succeed.
"""

__version__ = "0.1.0"
