"""crl_jax.data: task splits as TFDS datasets (array_record, read with `as_data_source`)."""

from crl_jax.data.task_splits import (
    DEFAULT_NUM_TEST,
    TEST_SEED_BASE,
    TRAIN_SEED_BASE,
    TaskSplits,
    build_task_splits,
    load_task_splits,
    task_seeds,
    task_specs,
)

__all__ = ["DEFAULT_NUM_TEST", "TEST_SEED_BASE", "TRAIN_SEED_BASE", "TaskSplits", "build_task_splits",
           "load_task_splits", "task_seeds", "task_specs"]
