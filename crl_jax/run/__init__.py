"""The host-side machinery of a run, around the trainer: config loading, checkpoints, metrics and
TensorBoard logs, the report, the workdir lock, graceful stops and multi-host exchange. Nothing
here is traced by JAX."""
