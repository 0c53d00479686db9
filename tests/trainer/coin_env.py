"""A one-turn environment whose outcome depends on what the model writes, for loop tests.

With untrained models, the real environments almost never succeed, so every advantage is zero
and no update moves a parameter. Here an answer wins when its length has the parity of the seed:
outcomes vary within a group, the policy gradient is non-zero, and the extractor's samples get
different rewards.
"""

from crl_jax.envs.base import TextEnv


class CoinEnv(TextEnv):
    name = "test/coin"
    max_turns = 1
    system_prompt = "A coin was tossed. Say heads or tails inside <answer>...</answer>."

    def _reset(self, seed):
        self._target = seed % 2
        return f"Coin number {seed % 7} is in the air.", "guess the coin", {}

    def valid_actions(self):
        return ["heads", "tails"]

    def parse_action(self, text):
        return text  # every reply is an action; its length decides

    def _step(self, action):
        success = len(action) % 2 == self._target
        return "The coin landed.", float(success), success, True, {}
