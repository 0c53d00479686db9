"""Records exchanged between hosts survive msgpack exactly, and nothing else gets through."""

import dataclasses

import numpy as np
import pytest

from crl_jax.run import host_exchange
from crl_jax.memory.text_store import Generation
from crl_jax.rollout.trajectory import EpisodeSpec, Trajectory


def test_trajectories_marks_and_replies_round_trip_exactly():
    refinement = Generation((1, 2, 3), (4, 5), (-0.5, -1.25), "refine")
    trajectory = Trajectory(EpisodeSpec("sokoban/6x6-2box", 7, 1, True), tokens=[1, 2, 3],
                            loss_mask=[0.0, 1.0, 1.0], logprobs=[0.0, -0.1, -2.5],
                            messages=[{"role": "user", "content": "go\u00e9"}], entry_id=None,
                            refinements=[refinement], reward=1.0, success=True, end_reason="done")
    payload = ([trajectory], [((3, 4), 2)], 1, None, {"k": np.float32(0.5)},
               np.arange(6, dtype=np.int16).reshape(2, 3), [("text", refinement)])
    back = host_exchange.unpack(host_exchange.pack(payload))
    assert back[0][0] == trajectory and dataclasses.asdict(back[0][0]) == dataclasses.asdict(trajectory)
    assert back[1] == [((3, 4), 2)] and back[2] == 1 and back[3] is None
    assert back[4]["k"] == np.float32(0.5) and back[4]["k"].dtype == np.float32
    np.testing.assert_array_equal(back[5], payload[5])
    assert back[5].dtype == np.int16 and back[6] == [("text", refinement)]


def test_unregistered_objects_are_refused_both_ways():
    class Callback:
        pass

    with pytest.raises(TypeError, match="cannot send a Callback"):
        host_exchange.pack([Callback()])
    forged = host_exchange.msgpack.packb(host_exchange.msgpack.ExtType(
        4, host_exchange.pack(["os.system", {"command": "true"}])))
    with pytest.raises(ValueError, match="unknown record type 'os.system'"):
        host_exchange.unpack(forged)
