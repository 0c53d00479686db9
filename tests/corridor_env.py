"""A short-prompt environment with a scripted expert, for fast warm-start tests.

The agent stands in a corridor and must walk east to its end; walking west wastes a turn. The
expert always walks east, so expert demos succeed and random ones mostly do not.
"""

from crl_jax.envs.base import ScriptedAgent, TextEnv


class CorridorEnv(TextEnv):
    name = "test/corridor"
    max_turns = 6
    system_prompt = "Walk to the end of the corridor. Say east or west inside <answer>...</answer>."

    def _reset(self, seed):
        self._length, self._position = 2 + seed % 2, 0
        return f"You are at cell {self._position} of {self._length}.", "reach the end", {}

    def valid_actions(self):
        return ["east", "west"]

    def _step(self, action):
        self._position = max(0, self._position + (1 if action == "east" else -1))
        done = self._position == self._length
        return f"You are at cell {self._position} of {self._length}.", float(done), done, done, {}

    def make_expert(self):
        return _WalkEast()


class _WalkEast(ScriptedAgent):
    def reset(self, env, observation, info):
        pass

    def act(self, observation, info):
        return "<answer>east</answer>"
