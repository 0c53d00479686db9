"""Rollout collection: reset a batch of episodes' environments, retrieve experience for the guided
ones, and run the actor loop; the same path for one process and for a multi-host run.

In a multi-host run (`hosts` given; see crl_jax/run/distributed.py) each host plays its own rows
with a host-local replica of the params, every host makes the same retrieval over the whole batch
(so the replicated banks count the same retrievals), and the trajectories are all-gathered, so
every host returns the whole step. The bank's "shown" marks of search-and-ask are queued during
the rollout and replayed on every host in process order, keeping the banks identical.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from crl_jax import envs
from crl_jax.envs.runner import GuardedEnv
from crl_jax.rollout.actor import ActorLoop, retrieval_query
from crl_jax.rollout.trajectory import EpisodeSpec

log = logging.getLogger("crl_jax")


class RolloutCollector:
    def __init__(self, actor_loop: ActorLoop, experience, step_timeout_s: float, hosts=None):
        self.actor_loop, self.experience, self.hosts = actor_loop, experience, hosts
        self.step_timeout_s = step_timeout_s
        self.env_pool: dict[str, list[GuardedEnv | None]] = {}

    def envs_for(self, specs: Sequence[EpisodeSpec]) -> list[GuardedEnv]:
        """One guarded environment per episode, reused across steps (MiniHack start-up is slow);
        an environment abandoned after a timeout is replaced by a fresh one."""
        used: dict[str, int] = {}
        out = []
        for spec in specs:
            pool = self.env_pool.setdefault(spec.task, [])
            index = used.get(spec.task, 0)
            if index == len(pool):
                pool.append(None)
            if pool[index] is None or pool[index].broken:
                pool[index] = GuardedEnv(envs.make(spec.task), self.step_timeout_s)
            out.append(pool[index])
            used[spec.task] = index + 1
        return out

    def collect(self, actor_params, extractor_params, specs: Sequence[EpisodeSpec], step: int,
                use_memory: bool, seed: int, allow_tools: bool = True, count_retrievals: bool = True):
        """(trajectories, injected entries) of all `specs`, in their order."""
        hosts, experience = self.hosts, self.experience
        rows = hosts.share(len(specs)) if hosts else slice(0, len(specs))
        local = list(specs[rows])
        guards = self.envs_for(local)
        firsts = [self._reset(guard, spec, step) for guard, spec in zip(guards, local)]
        entries = self._retrieve(specs, local, firsts, rows, step, count_retrievals) if use_memory \
            else [None] * len(specs)
        refine = None
        if use_memory and allow_tools:
            if hosts:
                extractor_params = hosts.local_params(extractor_params, "extractor")
            refine = experience.refiner(extractor_params, step, count=count_retrievals)
        if hosts:
            actor_params = hosts.local_params(actor_params, "actor")
        by_env = {id(g.env): g for g in guards}

        def run():
            trajectories = self.actor_loop.run(
                actor_params, [g.env for g in guards], local, entries[rows], seed, refine=refine,
                tool_enabled=[use_memory and allow_tools and s.guided for s in local],
                first_observations=firsts,
                guarded_call=lambda env, method, *args: by_env[id(env)].call(method, *args),
                first_row=rows.start)
            for traj, first in zip(trajectories, firsts):
                if first is None:
                    traj.end_reason = "env_error: reset failed"
            return trajectories

        return (self._gathered(run) if hosts else run()), entries

    @staticmethod
    def _reset(guard: GuardedEnv, spec: EpisodeSpec, step: int):
        tell = getattr(guard.env, "set_training_step", None)  # drifting environments read it
        if tell is not None:
            tell(step)
        first, error = guard.call("reset", spec.seed)
        if error:  # the episode fails; the batch goes on
            log.warning("reset of %s seed %d failed: %s", spec.task, spec.seed, error)
        return first

    def _retrieve(self, specs, local, firsts, rows: slice, step: int, count: bool) -> list:
        """Every row's retrieved entry (None for experience-free rows and failed resets): one
        retrieval over the whole batch, made alike on every host."""
        wanted = [(rows.start + i, retrieval_query(firsts[i][1].get("goal", ""), firsts[i][0]), spec.task)
                  for i, spec in enumerate(local) if spec.guided and firsts[i] is not None]
        if self.hosts:
            wanted = [query for host in self.hosts.allgather(wanted) for query in host]
        entries = [None] * len(specs)
        if wanted:
            found = self.experience.retrieve([q for _, q, _ in wanted], [t for _, _, t in wanted], step,
                                             count=count)
            for (row, _, _), entry in zip(wanted, found):
                entries[row] = entry
        return entries

    def _gathered(self, run) -> list:
        """Run this host's rows, then all-gather the whole batch and replay the hosts' bank marks
        and refinement counts in process order."""
        experience = self.experience
        marks: list = []
        refinements_before = experience.stats["refinements"] if experience is not None else 0
        if experience is not None:
            with experience.manager.deferred_marks() as marks:
                trajectories = run()
        else:
            trajectories = run()
        refinements = (experience.stats["refinements"] - refinements_before) if experience else 0
        hosts = self.hosts.allgather((trajectories, marks, refinements))
        if experience is not None:
            for _, host_marks, _ in hosts:
                for ids, mark_step in host_marks:
                    experience.manager.mark_shown(ids, mark_step)
            total = refinements_before + sum(n for _, _, n in hosts)
            if total or "refinements" in experience.stats:  # no zero entry a 1-process run lacks
                experience.stats["refinements"] = total
        return [t for host_trajs, _, _ in hosts for t in host_trajs]
