"""One process of a distributed test run: `python -m tests.distributed.worker OUT DEVICES SECTIONS`.

Sets `DEVICES` simulated CPU devices, joins the run when CRL_JAX_DISTRIBUTED=1 (coordinator from
the environment), runs the tiny trainer config updated with the JSON `SECTIONS`, and pickles what
the run ended with (global params gathered to numpy, this host's bank and text store, the metrics
rows) to OUT/process<index>.pkl. SECTIONS may also hold `workdir` and `seed_bank` (seed the
bank with the trainer tests' coin entries before the run).
"""

import json
import os
import pickle
import sys


def main(out: str, devices: int, sections: dict) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from crl_jax import config, envs
    from crl_jax.run import distributed

    distributed.initialize_from_env()
    from jax.experimental import multihost_utils

    from crl_jax import trainer as trainer_lib
    from tests.trainer.tiny_config import tiny_run

    envs.register("test/coin", "tests.trainer.coin_env", "CoinEnv")
    workdir = sections.pop("workdir")
    seed = sections.pop("seed_bank", False)
    cfg = config.from_dict(tiny_run(**sections))
    trainer = trainer_lib.Trainer(cfg, workdir)
    if seed:  # the same entries on every host, so retrieval and B_phi have work from step 1 on
        from tests.trainer.test_switches import seed_bank

        seed_bank(trainer)
    trainer.run()

    def gathered(params):
        flat = jax.tree_util.tree_flatten_with_path(multihost_utils.process_allgather(params, tiled=True))[0]
        return {jax.tree_util.keystr(k): v for k, v in flat}

    result = {"processes": jax.process_count(), "devices": jax.device_count(),
              "actor": gathered(trainer.actor_state.params),
              "extractor": gathered(trainer.extractor_state.params),
              "actor_step": int(trainer.actor_state.step),
              "extractor_step": int(trainer.extractor_state.step),
              "buffer": trainer.credit.buffer.to_json()}
    manager = trainer.experience.manager
    result["bank"] = {k: v for k, v in vars(jax.device_get(manager.bank)).items()}
    result["store"] = manager.store.to_json()
    result["memory_stats"] = dict(trainer.experience.stats)
    multihost_utils.sync_global_devices("worker.done")  # process 0's files are all written
    metrics = os.path.join(workdir, "metrics.jsonl")
    with open(metrics) as f:
        result["metrics"] = [json.loads(line) for line in f]
    with open(os.path.join(out, f"process{jax.process_index()}.pkl"), "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
