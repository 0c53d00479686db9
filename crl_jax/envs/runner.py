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

    records = [EpisodeRecord(env_name=e.name, seed=int(s)) for e, s in zip(envs, seeds)]
    workers = [_EnvWorker(env) for env in envs]
    obs: dict[int, str] = {}
    infos: dict[int, dict[str, Any]] = {}

    def finish(i: int, reason: str):
        records[i].reason = reason
        live.discard(i)

    def await_calls(calls: dict[int, cf.Future], timeout_s: float, what: str) -> dict[int, Any]:
        """Results of the calls that finished in time; the others end their episode."""
        deadline = time.monotonic() + timeout_s
        results = {}
        for i, future in calls.items():
            try:
                results[i] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                future.cancel()
                finish(i, f"timeout: {what} > {timeout_s:g}s")
            except BaseException as exc:  # noqa: BLE001
                finish(i, f"error: {_describe(exc)}")
        return results

    live = set(range(len(envs)))
    try:
        started = time.monotonic()
        resets = await_calls({i: workers[i].submit(envs[i].reset, records[i].seed) for i in live},
                             reset_timeout_s, "reset")
        reset_s = time.monotonic() - started
        for i, (observation, info) in resets.items():
            obs[i], infos[i] = observation, info
            records[i].goal = info.get("goal", "")
            records[i].transcript.append(
                {"observation": observation, "action": None, "reward": 0.0})
            records[i].env_seconds += reset_s
            if agents is not None:
                try:
                    agents[i].reset(getattr(envs[i], "unwrapped", envs[i]), observation, info)
                except Exception as exc:  # noqa: BLE001
                    finish(i, f"agent error: {_describe(exc)}")

        while live:
            order = sorted(live)
            actions: dict[int, str] = {}
            if policy is not None:
                texts = policy([obs[i] for i in order], [infos[i] for i in order])
                if len(texts) != len(order):
                    raise ValueError(
                        f"policy returned {len(texts)} actions for {len(order)} episodes")
                actions = dict(zip(order, texts))
            else:
                for i in order:
                    try:
                        actions[i] = agents[i].act(obs[i], infos[i])
                    except Exception as exc:  # noqa: BLE001
                        finish(i, f"agent error: {_describe(exc)}")
            started = time.monotonic()
            calls = {i: workers[i].submit(envs[i].step, actions[i]) for i in actions}
            results = await_calls(calls, step_timeout_s, "step")
            elapsed = time.monotonic() - started
            for i, (observation, reward, terminated, truncated, info) in results.items():
                rec = records[i]
                rec.turns += 1
                rec.env_steps += 1
                rec.env_seconds += elapsed
                rec.total_reward += float(reward)
                rec.success = bool(info.get("success", False))
                rec.transcript.append({"observation": observation, "action": actions[i],
                                       "reward": float(reward)})
                obs[i], infos[i] = observation, info
                if terminated or truncated:
                    ending = "truncated" if truncated else "terminated"
                    finish(i, "success" if rec.success else ending)
            for i in calls:
                if i not in results:
                    records[i].turns += 1  # the failed turn still counts
    finally:
        for worker in workers:
            worker.stop()
    return records


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
