"""The multi-turn actor loop: a batch of episodes, turn by turn, with exact token bookkeeping.

Every episode is one row of a `rollout.conversations.Conversations`: the first call prefills the prompt
(system message, with the retrieved experience for guided episodes, then the goal and first
observation); each later call appends only the new tokens (the end of the actor's turn, the
environment's reply, the next generation prompt) to that row's KV cache. The trajectory records the
same ids: the actor's sampled tokens are trained (with their sampler log-probs), everything else is
masked.

Search-and-ask: a guided episode whose turn ends with `</knowledge_search_and_ask>` gets, instead of
an environment step, a tool reply holding the extractor's refinement of the entry found for its
query (at most `max_tool_uses` per episode); the refinement generation is kept on the trajectory,
to be rewarded with the episode's outcome.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from crl_jax.envs.base import TextEnv
from crl_jax.memory import prompts
from crl_jax.memory.text_store import Entry, Generation
from crl_jax.rollout.trajectory import EpisodeSpec, Trajectory
from crl_jax.rollout.conversations import Sampler
from crl_jax.tokenizer import IM_END, Tokenizer

# (queries [(task, question)]) -> one (guidance text or None, Generation or None) per query
RefineFn = Callable[[list[tuple[str, str]]], list[tuple[str | None, Generation | None]]]
# (env, method name, args) -> (result, error text or None); the runner's guarded call
GuardedCall = Callable[..., tuple[object, str | None]]


def _direct_call(env, method: str, *args):
    try:
        return getattr(env, method)(*args), None
    except Exception as err:  # an environment fault ends only its own episode
        return None, f"{type(err).__name__}: {err}"


@dataclasses.dataclass(frozen=True)
class ActorLoopConfig:
    max_turns: int = 0              # 0 = each environment's own limit
    search_and_ask: bool = True
    max_tool_uses: int = 2


def retrieval_query(goal: str, observation: str) -> str:
    """The retrieval key of an episode: its goal and first observation."""
    return f"goal: {goal}, observation: {observation}" if goal else observation


def first_user_message(goal: str, observation: str) -> str:
    return f"Goal: {goal}\n\n{observation}" if goal else observation


class ActorLoop:
    def __init__(self, sampler: Sampler, tokenizer: Tokenizer, cfg: ActorLoopConfig,
                 guarded_call: GuardedCall = _direct_call):
        self.sampler, self.tokenizer, self.cfg = sampler, tokenizer, cfg
        self.guarded_call = guarded_call
        self.im_end = tokenizer.token_id(IM_END)
        self.last_timings: dict[str, float] = {}

    def _turn_tokens(self, role: str, content: str) -> list[int]:
        ids, _ = self.tokenizer.encode_turn({"role": role, "content": content})
        return ids

    def run(self, params, envs: Sequence[TextEnv], specs: Sequence[EpisodeSpec],
            entries: Sequence[Entry | None], seed: int, refine: RefineFn | None = None,
            tool_enabled: Sequence[bool] | None = None,
            first_observations: Sequence[tuple[str, dict] | None] | None = None,
            guarded_call: GuardedCall | None = None, first_row: int = 0) -> list[Trajectory]:
        """Run one episode per row to the end. `entries[b]` is injected into row b's system
        prompt; `tool_enabled[b]` allows search-and-ask on row b; `first_observations[b]`, when
        given, is row b's reset result; env calls go through `guarded_call` (default: direct).
        `first_row` is the global index of row 0 (it keys the rows' sampling randomness)."""
        call = guarded_call or self.guarded_call
        n = len(specs)
        tool_enabled = tool_enabled or [False] * n
        trajectories = [Trajectory(spec) for spec in specs]
        active = [True] * n
        new_tokens: list[list[int]] = [[] for _ in range(n)]
        turns_left = [0] * n
        tools_left = [self.cfg.max_tool_uses if tool_enabled[b] and self.cfg.search_and_ask else 0
                      for b in range(n)]
        spec = self.sampler.spec
        start = time.perf_counter()
        for b, (env, entry) in enumerate(zip(envs, entries)):
            reset = first_observations[b] if first_observations else None
            if reset is None:
                reset, error = call(env, "reset", specs[b].seed)
                if error:
                    self._end(trajectories[b], active, b, f"env_error: {error}")
                    continue
            new_tokens[b] = self._first_prompt(trajectories[b], env, reset, entry, tools_left[b] > 0)
            turns_left[b] = self.cfg.max_turns or env.max_turns
        conversations = self.sampler.new_conversations(n, seed=seed, first_row=first_row)
        while any(active):
            for b in range(n):
                if active[b] and len(trajectories[b].tokens) + spec.max_new_tokens > spec.cache_length:
                    self._end(trajectories[b], active, b, "context_full")
                    new_tokens[b] = []
            if not any(active):
                break
            result = conversations.step(params, [new_tokens[b] if active[b] else None for b in range(n)],
                                        active=active)
            tool_rows: list[int] = []
            for b in range(n):
                if not active[b]:
                    continue
                text = self._take_reply(trajectories[b], result.tokens[b].tolist(), result.logprobs[b],
                                        new_tokens, b)
                if tools_left[b] and text.rstrip().endswith(prompts.SEARCH_CLOSE):
                    tool_rows.append(b)
                    continue
                self._env_turn(call, envs[b], trajectories[b], text, active, b, new_tokens, turns_left)
            if tool_rows:
                self._tool_turns(trajectories, tool_rows, refine, new_tokens, tools_left, turns_left,
                                 active)
        self.last_timings = {"actor_rollout_s": time.perf_counter() - start}
        return trajectories

    def _first_prompt(self, traj: Trajectory, env: TextEnv, reset, entry: Entry | None,
                      tools: bool) -> list[int]:
        """Row `traj`'s first prompt from its reset (system prompt with the tool and the injected
        entry, then the goal and first observation); returns its tokens."""
        observation, info = reset
        traj.goal = info.get("goal", "")
        traj.query = retrieval_query(traj.goal, observation)
        system = env.system_prompt
        if tools:
            system += "\n\n" + prompts.SEARCH_TOOL_TEXT
        if entry is not None:
            traj.entry_id = entry.entry_id
            system = prompts.inject_experience(system, entry.render())
        user = first_user_message(traj.goal, observation)
        traj.messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        encoded = self.tokenizer.encode_chat(traj.messages, add_generation_prompt=True)
        traj.append(encoded.ids, trained=False)
        return encoded.ids.tolist()

    def _take_reply(self, traj: Trajectory, generated: list[int], logprobs, new_tokens, b: int) -> str:
        """Append the model's reply (trained) and its turn's closing tokens (not trained) to row
        b; returns the reply's text."""
        traj.append(generated, trained=True, logprobs=logprobs)
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        traj.messages.append({"role": "assistant", "content": text})
        closing = [] if generated and generated[-1] == self.im_end else [self.im_end]
        new_tokens[b] = closing + self.tokenizer.encode("\n")
        traj.append(new_tokens[b], trained=False)
        return text

    def _env_turn(self, call, env, traj: Trajectory, text: str, active, b, new_tokens, turns_left):
        result, error = call(env, "step", text)
        if error:
            self._end(traj, active, b, f"env_error: {error}")
            return
        observation, reward, terminated, truncated, info = result
        traj.actions += 1
        traj.invalid_actions = int(info.get("invalid_actions", traj.invalid_actions))
        traj.success = bool(info.get("success", False))
        traj.reward = 1.0 if traj.success else 0.0
        turns_left[b] -= 1
        if terminated or truncated or turns_left[b] <= 0:
            traj.final_observation = observation
            self._end(traj, active, b, "success" if traj.success else
                      ("terminated" if terminated else "max_turns"))
            return
        self._reply(traj, "user", observation, new_tokens, b)

    def _tool_turns(self, trajectories, rows, refine, new_tokens, tools_left, turns_left, active):
        queries = []
        for b in rows:
            text = trajectories[b].messages[-1]["content"]
            question = text.rsplit(prompts.SEARCH_OPEN, 1)[-1].replace(prompts.SEARCH_CLOSE, "").strip()
            queries.append((trajectories[b].spec.task, question))
        answers = refine(queries) if refine is not None else [(None, None)] * len(rows)
        for b, (guidance, generation) in zip(rows, answers):
            traj = trajectories[b]
            traj.tool_calls += 1
            tools_left[b] -= 1
            turns_left[b] -= 1
            if generation is not None:
                traj.refinements.append(generation)
            if turns_left[b] <= 0:
                self._end(traj, active, b, "max_turns")
                continue
            self._reply(traj, "user", prompts.search_result_text(guidance), new_tokens, b)

    def _reply(self, traj: Trajectory, role: str, content: str, new_tokens, b):
        ids = self._turn_tokens(role, content) + self.tokenizer.generation_prompt()
        traj.messages.append({"role": role, "content": content})
        traj.append(ids, trained=False)
        new_tokens[b] = new_tokens[b] + ids

    @staticmethod
    def _end(traj: Trajectory, active, b, reason: str):
        traj.end_reason = reason
        active[b] = False
