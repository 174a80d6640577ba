"""TensorFlow's sync modes on real Horovod workers (2 processes, Gloo), tested like PyTorch's
(tests/parallel/test_schemes.py): one round against the numpy simulation at W = 2, and the modes trained beside the
ring all-reduce from the same start over the same samples (tests/parallel/tf_schemes_workers.py)."""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from hvdsync.core.comm.schemes import gossip
from tests.parallel import ps_checks, tf_schemes_workers

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


def test_sharded_and_single_parameter_servers_reach_the_ring_parameters(checks):
    # The assertions and tolerances of PyTorch's (tests/parallel/ps_checks.py), and one round a step here.
    runs = checks[0]["runs"]
    ps_checks.reach_the_ring(runs)
    for name in ("ps_sharded", "ps_single"):
        assert runs[name]["rounds"] == runs[name]["traffic"]["rounds"] == runs[name]["steps"]


def test_parameter_server_bytes_single_server_vs_sharded_vs_ring_counted(checks):
    runs = [r["runs"] for r in checks]
    ps_checks.bytes_counted(runs)
    assert runs[0]["ps_fp16"]["wire"]["bytes"] == runs[0]["allreduce"]["wire"]["bytes"] / 2


def test_one_parameter_server_round_equals_the_numpy_simulation_at_two_ranks(checks):
    ps_checks.rounds_match_the_simulation(checks)
    for key in ("ps0", "ps1"):
        assert all(r["rounds"][key]["traffic"]["rounds"] == 1 for r in checks)


def test_the_optimizer_state_lives_at_the_owner_of_each_shard(checks):
    # 18 parameters: two shards of 9, or all 18 at rank 0 and none at rank 1; each rank holds its shard, the pushed
    # gradient and Adam's two moments for that shard only.
    for servers, lengths in ((0, (9, 9)), (1, (18, 0))):
        for rank, r in enumerate(checks):
            got = r["shards"][servers]
            assert sorted(shape for _, shape in got["sharded"]) == [(lengths[rank],)] * 4, (servers, rank)
            assert {name.split("_")[-1] for name, _ in got["sharded"]} >= {"momentum", "velocity"}
            assert got["iterations"] == got["rounds"] == 2                # a rank that owns nothing steps too
        # What broadcast_state and checkpoints see is the same list on both ranks, and the pull made them agree.
        assert checks[0]["shards"][servers]["replicated"] == checks[1]["shards"][servers]["replicated"]
        assert ps_checks.max_diff(checks[0]["shards"][servers]["params"], checks[1]["shards"][servers]["params"]) == 0.0
