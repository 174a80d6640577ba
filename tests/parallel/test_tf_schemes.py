"""TensorFlow's sync modes on real Horovod workers (2 processes, Gloo), tested like PyTorch's
(tests/parallel/test_schemes.py): one round against the numpy simulation at W = 2, and the modes trained beside the
ring all-reduce from the same start over the same samples (tests/parallel/tf_schemes_workers.py)."""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from hvdsync.core.comm.schemes import gossip
from tests.parallel import tf_schemes_workers

cloudpickle.register_pickle_by_value(tf_schemes_workers)


@pytest.fixture(scope="module")
def checks():
    results = launch.run(tf_schemes_workers.run_checks, np=2, progress=False)
    assert [r["size"] for r in results] == [2, 2]
    return results


def test_one_gossip_round_equals_the_numpy_simulation_at_two_ranks(checks):
    rounds = [r["rounds"]["gossip"] for r in checks]
    mixed = gossip.mix([r["start"] for r in rounds])
    assert not np.allclose(rounds[0]["start"], rounds[1]["start"])      # the ranks started apart
    for rank, r in enumerate(rounds):
        np.testing.assert_allclose(r["after"], mixed[rank] - 0.5 * r["grad"], atol=1e-5)
        assert r["traffic"]["sent"] == r["traffic"]["received"] == gossip.traffic(18, 4, 2).sent[rank]
        assert r["traffic"]["rounds"] == 1


def test_gossip_trains_within_two_points_of_the_ring_and_mixes_every_period(checks):
    runs = checks[0]["runs"]
    assert runs["allreduce"]["accuracy"] > 0.85                       # it trained
    steps = runs["allreduce"]["steps"]
    numel = sum(p.size for p in runs["allreduce"]["params"])
    for name, period in (("gossip", 1), ("gossip_h4", 4)):
        assert runs[name]["steps"] == steps > 40
        assert runs[name]["rounds"] == runs[name]["traffic"]["rounds"] == -(-steps // period)
        # W = 2: one neighbour, the whole float32 parameter vector each way per mixing, counted on the wire too
        assert runs[name]["traffic"]["sent"] == runs[name]["rounds"] * numel * 4 == runs[name]["wire"]["bytes"]
        assert abs(runs[name]["accuracy"] - runs["allreduce"]["accuracy"]) <= 0.02, name
    # Every step mixes with the other rank and then steps on its own gradient: close to the ring, not equal to it.
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(runs["gossip"]["params"], runs["allreduce"]["params"]))
    assert 1e-6 < diff < 0.5
