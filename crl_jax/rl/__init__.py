"""crl_jax.rl: the RL core of Complementary RL.

- advantages: subgroup GRPO (actor) and centred, training-count-weighted rewards (extractor);
- losses: PPO-clip (actor) and CISPO (extractor), `POLICY_LOSSES`;
- batch: the padded device batch (`PolicyBatch`, `TrainBatch`);
- logprobs: chunked per-token log-probs, `compute_logprobs`;
- state: `TrainState`, AdamW, shardings from logical axes;
- train_step: the joint, jitted, sharded update (`train_step`, `make_train_step`, `TrainConfig`);
- aot: compile the step for a TPU topology without a TPU (memory and FLOPs per chip);
- updater: the host side of one step's update (length buckets, one compile per shape, role split).
"""

from crl_jax.rl.batch import PolicyBatch, TrainBatch, make_policy_batch
from crl_jax.rl.logprobs import compute_logprobs
from crl_jax.rl.losses import POLICY_LOSSES, LossConfig
from crl_jax.rl.state import OptimizerConfig, TrainState, make_optimizer
# `train_step` the function stays in its module: re-exporting it here would shadow the module.
from crl_jax.rl.train_step import TrainConfig, make_train_step

__all__ = [
    "POLICY_LOSSES", "LossConfig", "OptimizerConfig", "PolicyBatch", "TrainBatch", "TrainConfig",
    "TrainState", "compute_logprobs", "make_optimizer", "make_policy_batch", "make_train_step",
]
