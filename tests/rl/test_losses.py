"""PPO-clip and CISPO losses (values and gradients) against short numpy references."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from crl_jax.rl import losses


def np_aggregate(v, m, agg):
    if agg == "token_mean":
        return (v * m).sum() / m.sum()
    lens = m.sum(-1)
    rows = lens > 0
    return ((v * m).sum(-1)[rows] / lens[rows]).mean()


def np_ppo(logp, old, a, m, eps_lo, eps_hi, agg, ref=None, kl_coef=0.0):
    ratio = np.exp(logp - old)
    a = a[:, None]
    obj = np.minimum(ratio * a, np.clip(ratio, 1 - eps_lo, 1 + eps_hi) * a)
    loss = np_aggregate(-obj, m, agg)
    if kl_coef:
        d = ref - logp
        loss += kl_coef * np_aggregate(np.exp(d) - d - 1, m, agg)
    return loss


def np_ppo_grad(logp, old, a, m, eps_lo, eps_hi, agg):
    """d loss / d logp: ratio * A where the unclipped branch is active, else 0."""
    ratio = np.exp(logp - old)
    a = a[:, None]
    active = ratio * a <= np.clip(ratio, 1 - eps_lo, 1 + eps_hi) * a
    g = -np.where(active, ratio * a, 0.0) * m
    if agg == "token_mean":
        return g / m.sum()
    lens = m.sum(-1, keepdims=True)
    return g / np.maximum(lens, 1) / (lens > 0).sum()


def _batch(seed=0, b=6, t=12):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.1, 3.0, (b, t)).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)  # ratios well outside [0.8, 1.2]
    ref = (logp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    mask = (rng.uniform(size=(b, t)) < 0.6).astype(np.float32)
    mask[:, 0] = 0
    mask[2] = 0  # a sequence with no response tokens must not count in seq_mean
    return logp, old, ref, adv, mask


class PPOTest(chex.TestCase, parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(agg=losses.AGGREGATIONS, eps=((0.2, 0.2), (0.1, 0.28)))
    def test_value_and_grad_match_numpy(self, agg, eps):
        logp, old, _, adv, mask = _batch()
        cfg = losses.LossConfig("ppo", eps[0], eps[1], agg)
        fn = self.variant(jax.value_and_grad(
            lambda lp: losses.ppo_loss(lp, old, adv, mask, cfg=cfg)[0]))
        val, grad = fn(logp)
        np.testing.assert_allclose(val, np_ppo(logp, old, adv, mask, *eps, agg),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, np_ppo_grad(logp, old, adv, mask, *eps, agg), atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_kl_penalty_and_metrics(self):
        logp, old, ref, adv, mask = _batch(1)
        cfg = losses.LossConfig("ppo", kl_coef=0.05)
        val, metrics = self.variant(lambda *a: losses.ppo_loss(*a[:4], cfg=cfg, ref_logprobs=a[4]))(
            logp, old, adv, mask, ref)
        want = np_ppo(logp, old, adv, mask, 0.2, 0.2, cfg.aggregation, ref, 0.05)
        np.testing.assert_allclose(val, want, rtol=1e-5)
        ratio = np.exp(logp - old)
        np.testing.assert_allclose(metrics["clip_frac_high"],
                                   ((ratio > 1.2) * mask).sum() / mask.sum(), atol=1e-6)
        np.testing.assert_allclose(metrics["approx_kl"],
                                   ((ratio - 1 - np.log(ratio)) * mask).sum() / mask.sum(), rtol=1e-5)

    def test_micro_batch_losses_add_up(self):
        logp, old, _, adv, mask = _batch(2, b=8)
        cfg = losses.LossConfig("ppo")
        whole = losses.ppo_loss(logp, old, adv, mask, cfg=cfg)[0]
        n_tok, n_seq = losses.batch_normalizers(mask)
        parts = sum(losses.ppo_loss(logp[s], old[s], adv[s], mask[s], cfg=cfg, num_tokens=n_tok,
                                    num_seqs=n_seq)[0] for s in (slice(0, 3), slice(3, 8)))
        np.testing.assert_allclose(parts, whole, rtol=1e-6)


class CISPOTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_value_and_grad_match_numpy(self):
        logp, old, _, adv, mask = _batch(3)
        cfg = losses.LossConfig("cispo", 0.1, 0.1, "token_mean")
        val, grad = self.variant(jax.value_and_grad(
            lambda lp: losses.cispo_loss(lp, old, adv, mask, cfg=cfg)[0]))(logp)
        w = np.clip(np.exp(logp - old), 0.9, 1.1)
        n = mask.sum()
        np.testing.assert_allclose(val, -(w * adv[:, None] * logp * mask).sum() / n, rtol=1e-5)
        # The weight is stop-gradient: every masked token keeps gradient -w * A / N, none is zeroed.
        np.testing.assert_allclose(grad, -w * adv[:, None] * mask / n, atol=1e-7)
        assert (np.abs(grad)[mask > 0] > 0).all()


def test_token_logprobs_and_entropy_match_numpy():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, (2, 5))
    logz = np.log(np.exp(logits).sum(-1, keepdims=True))
    lsm = logits - logz
    want = np.zeros((2, 5), np.float32)
    want[:, 1:] = np.take_along_axis(lsm[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(losses.token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)),
                               want, atol=1e-5)
    ent = np.zeros((2, 5), np.float32)
    ent[:, 1:] = -(np.exp(lsm) * lsm).sum(-1)[:, :-1]
    np.testing.assert_allclose(losses.token_entropy(jnp.asarray(logits)), ent, atol=1e-5)


def test_config_problems_are_listed():
    bad = losses.LossConfig("reinforce", eps_low=1.5, aggregation="sum")
    problems = bad.problems()
    assert len(problems) == 3 and all("\n" not in p for p in problems)
