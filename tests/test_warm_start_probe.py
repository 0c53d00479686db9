"""experiments/warm_start_probe.py: how expert actions are grouped, and the whole-action
probability against a direct numpy computation."""

import importlib.util
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))  # the probe imports run.py's argument parser
_spec = importlib.util.spec_from_file_location(
    "warm_start_probe", os.path.join(ROOT, "experiments", "warm_start_probe.py"))
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


@pytest.mark.parametrize("text, kind", [
    ("<answer>north</answer>", "north"),
    ("<answer>click[b048yuczes]</answer>", "click[<id>]"),
    ("<answer>click[buy now]</answer>", "click"),
    ("<answer>click[grey]</answer>", "click"),
    ("<answer>search[lightweight laptop backpack]</answer>", "search"),
    ("<answer>take spoon 1 from drawer 2</answer>", "take"),
    ("go to sinkbasin 1", "go"),
])
def test_action_kind(text, kind):
    assert probe.action_kind(text) == kind


def test_expert_action_probabilities_multiply_each_span():
    rng = np.random.default_rng(0)
    log_probs = np.log(rng.uniform(0.1, 1.0, 12))
    mask = np.zeros(12, bool)
    mask[[2, 3, 4, 8, 9]] = True
    got = probe.expert_action_probabilities(log_probs, mask)
    want = [np.prod(np.exp(log_probs[2:5])), np.prod(np.exp(log_probs[8:10]))]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert probe.expert_action_probabilities(log_probs, np.zeros(12, bool)) == []
