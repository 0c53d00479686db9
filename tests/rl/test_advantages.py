"""Subgroup GRPO and extractor advantages against short numpy references."""
import chex
import numpy as np
import pytest
from absl.testing import parameterized

from crl_jax.rl import advantages as adv


def np_group_advantages(r, g, guided, normalization, split, eps=1e-6):
    out = np.zeros_like(r)
    if split == "batch":
        keys = [0] * len(r)
    elif split == "group":
        keys = list(g)
    else:
        keys = list(zip(g, guided))
    for key in set(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        sub = r[idx]
        a = sub - sub.mean()
        if normalization == "mean_std":
            a = a / (sub.std() + eps)
        out[idx] = a
    return out


def _rollouts(seed=0, groups=4, k=8):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 2, size=groups * k).astype(np.float32)
    r[:4] = 1.0  # one all-success subgroup: std 0 -> advantage 0, never NaN
    g = np.repeat(rng.permutation(100)[:groups], k)
    guided = np.tile(np.arange(k) >= k // 2, groups)  # released layout: first half experience-free
    return r, g, guided


class GroupAdvantagesTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(normalization=adv.NORMALIZATIONS, split=adv.SPLITS)
    def test_matches_numpy(self, normalization, split):
        r, g, guided = _rollouts()
        fn = self.variant(lambda r, g, m: adv.group_advantages(
            r, g, m, normalization=normalization, split=split))
        got = np.asarray(fn(r, g, guided))
        want = np_group_advantages(r, g, guided, normalization, split)
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert np.isfinite(got).all()

    @chex.variants(with_jit=True, without_jit=True)
    def test_subgroups_are_independent(self):
        # Guided rollouts all succeed, free ones half succeed: cross-subgroup normalisation would
        # give guided successes a positive advantage; the split gives them exactly 0.
        r = np.array([1, 0, 1, 0, 1, 1, 1, 1], np.float32)
        guided = np.arange(8) >= 4
        got = np.asarray(self.variant(adv.group_advantages)(r, np.zeros(8, np.int32), guided))
        np.testing.assert_allclose(got[4:], 0.0, atol=1e-6)
        np.testing.assert_allclose(got[:4], [1, -1, 1, -1], atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_padding_rows_ignored(self):
        r, g, guided = _rollouts(1)
        valid = np.ones_like(r, bool)
        valid[-3:] = False
        r_pad = r.copy()
        r_pad[-3:] = 1e6
        got = np.asarray(self.variant(adv.group_advantages)(r_pad, g, guided, valid))
        want = np_group_advantages(r[:-3], g[:-3], guided[:-3], "mean_std", "subgroup")
        np.testing.assert_allclose(got[:-3], want, atol=1e-5)
        np.testing.assert_array_equal(got[-3:], 0.0)


class ExtractorAdvantagesTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_buffer_rewards_eq7_weights_and_centred_advantages(self):
        """The path training takes: B_phi's mean +-1 reward per generation, Eq.7 weights from the
        bank's training counters, then the batch-centred advantage, against numpy."""
        import jax

        from crl_jax.memory import bank as bank_lib
        from crl_jax.memory.text_store import Generation
        from crl_jax.rollout.reward_buffer import RewardBuffer

        rng = np.random.default_rng(3)
        success = rng.integers(0, 2, size=40).astype(bool)
        used = rng.integers(-1, 6, size=40)  # the generation each episode used, -1: none
        buffer = RewardBuffer()
        for ok, g in zip(success, used):
            if g >= 0:
                buffer.add_use(Generation((g,), (g, 1)), bool(ok), entry_id=int(g))
        samples = buffer.pop_batch(len(buffer))
        gens = [next(iter(s.entry_ids)) for s in samples]
        rewards = np.array([s.reward for s in samples], np.float32)
        pm1 = np.where(success, 1.0, -1.0)
        np.testing.assert_allclose(rewards, [pm1[used == g].mean() for g in gens], atol=1e-6)

        bank = bank_lib.init_bank(1, 8, 2)
        bank, ids, _ = jax.jit(bank_lib.add)(bank, np.ones((6, 2), np.float32), np.zeros(6, np.int32), 0)
        trained = {0: [3, 9], 1: [4], 3: [10], 4: [2, 5, 8]}  # steps at which each was trained
        for step in range(11):
            at = [int(ids[g]) for g, steps in trained.items() if step in steps]
            if at:
                bank = bank_lib.mark_trained(bank, np.asarray(at, np.int32), step)
        entry_ids = np.asarray([int(ids[g]) for g in gens], np.int32)
        weights = bank_lib.train_weights(bank, entry_ids, 10, cooldown=2, power=0.5)
        count = np.array([len(trained.get(g, [])) for g in gens])
        last = np.array([max(trained.get(g, [-100])) for g in gens])
        want_w = np.where((count > 0) & (10 - last < 2), 0.0, (1.0 + count) ** -0.5)
        np.testing.assert_allclose(weights, want_w, rtol=1e-6)

        got = np.asarray(self.variant(adv.extractor_advantages)(rewards, weights))
        np.testing.assert_allclose(got, (rewards - rewards.mean()) * want_w, atol=1e-6)
        assert (want_w == 0).any() and (want_w < 1).any()  # the cooldown and the decay both act


def test_bad_inputs_raise_one_line_errors():
    with pytest.raises(ValueError, match="normalization must be one of"):
        adv.group_advantages(np.zeros(4), np.zeros(4), np.zeros(4, bool), normalization="std")
    with pytest.raises(ValueError, match="must all have shape"):
        adv.group_advantages(np.zeros(4), np.zeros(3), np.zeros(4, bool))
