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
    def test_generation_rewards_and_advantages(self):
        rng = np.random.default_rng(3)
        scores = rng.integers(0, 2, size=40).astype(np.float32)
        gen = rng.integers(-1, 6, size=40)
        step, last, count = 10, np.array([9, 3, 0, 10, 8, 0]), np.array([1, 2, 0, 4, 1, 0])
        fn = self.variant(lambda s, e, st, lt, c: adv.extractor_advantages(
            adv.generation_rewards(adv.outcome_to_pm1(s), e, 6)[0],
            adv.training_count_weights(st, lt, c, cooldown=2, alpha=0.5)))
        got = np.asarray(fn(scores, gen, step, last, count))
        pm1 = np.where(scores == 0, -1.0, scores)
        rew = np.array([pm1[gen == i].mean() if (gen == i).any() else 0.0 for i in range(6)])
        w = np.where((count > 0) & (step - last < 2), 0.0, (1.0 + count) ** -0.5)
        np.testing.assert_allclose(got, (rew - rew.mean()) * w, atol=1e-6)
        assert got[0] == 0.0 and got[3] == 0.0  # trained 1 and 0 steps ago: in cooldown


def test_bad_inputs_raise_one_line_errors():
    with pytest.raises(ValueError, match="normalization must be one of"):
        adv.group_advantages(np.zeros(4), np.zeros(4), np.zeros(4, bool), normalization="std")
    with pytest.raises(ValueError, match="must all have shape"):
        adv.group_advantages(np.zeros(4), np.zeros(3), np.zeros(4, bool))
    with pytest.raises(ValueError, match="cooldown and alpha"):
        adv.training_count_weights(0, np.zeros(2), np.zeros(2), alpha=-1.0)
