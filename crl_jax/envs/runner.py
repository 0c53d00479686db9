"""Batched host runner: plays a batch of episodes, each env isolated in its own worker thread.

Owns: stepping B (env, agent) episodes in lock-step turns, with every env call (reset, step) run in
that env's own daemon thread and awaited with a timeout. An env that raises or overruns the timeout
ends *its own* episode as failed, with the reason recorded; the rest of the batch goes on. A hung
env's thread is abandoned (daemon threads do not block interpreter exit) and that env object is
never called again by this batch; it may still be running, so callers must not reuse it.
Actions come either from per-episode `ScriptedAgent`s or from one batched policy
`policy(observations, infos) -> action texts` (how an LLM actor plugs in).

Returns one `EpisodeRecord` per episode: success, turns, reason, reward and the transcript.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Sequence

from crl_jax.envs.base import ScriptedAgent, TextEnv


@dataclasses.dataclass
class EpisodeRecord:
    env_name: str
    seed: int
    goal: str = ""
    success: bool = False
    turns: int = 0
    total_reward: float = 0.0
    # "success", "terminated", "truncated", "error: <type>: <message>", "timeout: <call> > <s>s",
    # or "agent error: ...".
    reason: str = ""
    # [{"observation": str, "action": str | None, "reward": float}], first entry is the reset.
    transcript: list = dataclasses.field(default_factory=list)
    env_steps: int = 0
    # Wall time of the batched env calls this episode took part in (a batch waits for its slowest).
    env_seconds: float = 0.0

    @property
    def failed_by_fault(self) -> bool:
        return self.reason.startswith(("error", "timeout", "agent error"))


class _EnvWorker:
    """One daemon thread that runs calls on one env, so a hung call only strands this thread."""

    def __init__(self, env: TextEnv):
        self.env = env
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"env-{env.name}")
        self._thread.start()

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - any env failure is recorded, not raised
                future.set_exception(exc)

    def submit(self, fn, *args) -> cf.Future:
        future: cf.Future = cf.Future()
        self._jobs.put((future, fn, args))
        return future

    def stop(self):
        self._jobs.put(None)


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def run_batch(
    envs: Sequence[TextEnv],
    seeds: Sequence[int],
    agents: Sequence[ScriptedAgent] | None = None,
    policy: Callable[[list, list], list] | None = None,
    step_timeout_s: float = 30.0,
    reset_timeout_s: float | None = None,
) -> list[EpisodeRecord]:
    """Play one episode per (env, seed) and return their records, in input order.

    Give either `agents` (one per env) or `policy`, called once per turn with the observations and
    infos of the episodes still running and returning one action text for each.
    """
    if len(envs) != len(seeds):
        raise ValueError(f"run_batch: {len(envs)} envs but {len(seeds)} seeds")
    if (agents is None) == (policy is None):
        raise ValueError("run_batch: give exactly one of `agents` or `policy`")
    if agents is not None and len(agents) != len(envs):
        raise ValueError(f"run_batch: {len(envs)} envs but {len(agents)} agents")
    if step_timeout_s <= 0:
        raise ValueError(f"run_batch: step_timeout_s must be > 0, got {step_timeout_s}")
    reset_timeout_s = reset_timeout_s or max(step_timeout_s, 60.0)

    play = _BatchPlay(envs, seeds, agents, policy)
    try:
        play.reset(reset_timeout_s)
        while play.live:
            play.step(play.choose_actions(), step_timeout_s)
    finally:
        for worker in play.workers:
            worker.stop()
    return play.records


class _BatchPlay:
    """The state of one `run_batch`: records, each env's worker thread, the running episodes."""

    def __init__(self, envs, seeds, agents, policy):
        self.envs, self.agents, self.policy = envs, agents, policy
        self.records = [EpisodeRecord(env_name=e.name, seed=int(s)) for e, s in zip(envs, seeds)]
        self.workers = [_EnvWorker(env) for env in envs]
        self.obs: dict[int, str] = {}
        self.infos: dict[int, dict[str, Any]] = {}
        self.live = set(range(len(envs)))

    def finish(self, i: int, reason: str) -> None:
        self.records[i].reason = reason
        self.live.discard(i)

    def await_calls(self, calls: dict[int, cf.Future], timeout_s: float, what: str) -> dict[int, Any]:
        """Results of the calls that finished in time; the others end their episode."""
        deadline = time.monotonic() + timeout_s
        results = {}
        for i, future in calls.items():
            try:
                results[i] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                future.cancel()
                self.finish(i, f"timeout: {what} > {timeout_s:g}s")
            except BaseException as exc:  # noqa: BLE001
                self.finish(i, f"error: {_describe(exc)}")
        return results

    def reset(self, timeout_s: float) -> None:
        envs, records = self.envs, self.records
        started = time.monotonic()
        resets = self.await_calls({i: self.workers[i].submit(envs[i].reset, records[i].seed)
                                   for i in self.live}, timeout_s, "reset")
        reset_s = time.monotonic() - started
        for i, (observation, info) in resets.items():
            self.obs[i], self.infos[i] = observation, info
            records[i].goal = info.get("goal", "")
            records[i].transcript.append({"observation": observation, "action": None, "reward": 0.0})
            records[i].env_seconds += reset_s
            if self.agents is not None:
                try:
                    self.agents[i].reset(getattr(envs[i], "unwrapped", envs[i]), observation, info)
                except Exception as exc:  # noqa: BLE001
                    self.finish(i, f"agent error: {_describe(exc)}")

    def choose_actions(self) -> dict[int, str]:
        order = sorted(self.live)
        if self.policy is not None:
            texts = self.policy([self.obs[i] for i in order], [self.infos[i] for i in order])
            if len(texts) != len(order):
                raise ValueError(f"policy returned {len(texts)} actions for {len(order)} episodes")
            return dict(zip(order, texts))
        actions: dict[int, str] = {}
        for i in order:
            try:
                actions[i] = self.agents[i].act(self.obs[i], self.infos[i])
            except Exception as exc:  # noqa: BLE001
                self.finish(i, f"agent error: {_describe(exc)}")
        return actions

    def step(self, actions: dict[int, str], timeout_s: float) -> None:
        started = time.monotonic()
        calls = {i: self.workers[i].submit(self.envs[i].step, actions[i]) for i in actions}
        results = self.await_calls(calls, timeout_s, "step")
        elapsed = time.monotonic() - started
        for i, (observation, reward, terminated, truncated, info) in results.items():
            rec = self.records[i]
            rec.turns += 1
            rec.env_steps += 1
            rec.env_seconds += elapsed
            rec.total_reward += float(reward)
            rec.success = bool(info.get("success", False))
            rec.transcript.append({"observation": observation, "action": actions[i], "reward": float(reward)})
            self.obs[i], self.infos[i] = observation, info
            if terminated or truncated:
                self.finish(i, "success" if rec.success else "truncated" if truncated else "terminated")
        for i in calls:
            if i not in results:
                self.records[i].turns += 1  # the failed turn still counts


class GuardedEnv:
    """One environment whose calls run in its own worker thread and are awaited with a timeout.

    For loops that drive environments themselves (the LLM actor loop): `call(method, *args)` returns
    `(result, None)`, or `(None, reason)` when the call raised or overran `timeout_s`. After a
    timeout the env may still be running in its thread, so it is marked `broken` and never called
    again; the owner replaces it.
    """

    def __init__(self, env: TextEnv, timeout_s: float):
        if timeout_s <= 0:
            raise ValueError(f"GuardedEnv: timeout_s must be > 0, got {timeout_s}")
        self.env, self.timeout_s = env, timeout_s
        self.broken = False
        self._worker = _EnvWorker(env)

    def call(self, method: str, *args) -> tuple[Any, str | None]:
        if self.broken:
            return None, "error: environment abandoned after an earlier timeout"
        future = self._worker.submit(getattr(self.env, method), *args)
        try:
            return future.result(timeout=self.timeout_s), None
        except cf.TimeoutError:
            future.cancel()
            self.broken = True
            return None, f"timeout: {method} > {self.timeout_s:g}s"
        except BaseException as exc:  # noqa: BLE001 - an env failure ends only its episode
            return None, f"error: {_describe(exc)}"

    def close(self) -> None:
        self._worker.stop()
