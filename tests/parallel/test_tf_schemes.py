"""TensorFlow's sync modes on real Horovod workers (2 processes, Gloo), tested like PyTorch's
(tests/parallel/test_schemes.py): one round against the numpy simulation at W = 2, and the modes trained beside the
ring all-reduce from the same start over the same samples (tests/parallel/tf_schemes_workers.py)."""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from hvdsync.core.comm.schemes import gossip, ps
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


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def test_sharded_and_single_parameter_servers_reach_the_ring_parameters(checks):
    # The assertions and tolerances of PyTorch's (tests/parallel/test_schemes.py).
    runs = checks[0]["runs"]
    ring = runs["allreduce"]["params"]
    assert runs["allreduce"]["accuracy"] > 0.85                     # it trained
    for name in ("ps_sharded", "ps_single"):
        assert runs[name]["steps"] == runs["allreduce"]["steps"] > 40
        assert runs[name]["rounds"] == runs[name]["traffic"]["rounds"] == runs[name]["steps"]  # one per step
        assert _max_diff(runs[name]["params"], ring) < 1e-5, name
        assert runs[name]["spread"] == 0.0                          # every rank pulled the same parameters
    assert 1e-6 < _max_diff(runs["ps_fp16"]["params"], ring) < 5e-2  # fp16 pushes: close, not equal
    assert runs["ps_fp16"]["wire"]["dtypes"] == ["float16"]


def test_parameter_server_bytes_single_server_vs_sharded_vs_ring_counted(checks):
    runs = [r["runs"] for r in checks]
    steps = runs[0]["allreduce"]["steps"]
    payload = runs[0]["allreduce"]["wire"]["bytes"] / steps        # gradient bytes one rank hands over per step
    assert runs[0]["ps_sharded"]["wire"]["bytes"] == runs[0]["allreduce"]["wire"]["bytes"]
    assert runs[0]["ps_fp16"]["wire"]["bytes"] == runs[0]["allreduce"]["wire"]["bytes"] / 2
    single0, single1 = runs[0]["ps_single"]["traffic"], runs[1]["ps_single"]["traffic"]
    # The server receives W-1 gradients per step and sends W-1 copies of the parameters; a worker one of each.
    assert single0["received"] == single0["sent"] == (2 - 1) * payload * steps
    assert single1["received"] == single1["sent"] == payload * steps
    # Sharded: each rank sends (W-1)/W of the push and of the pull: 2 (W-1)/W S per step, the ring's law.
    for r in runs:
        assert r["ps_sharded"]["traffic"]["sent"] == pytest.approx(2 * (2 - 1) / 2 * payload * steps, rel=0.01)
    assert single0["sent"] + single0["received"] == pytest.approx(
        (2 - 1) * (runs[0]["ps_sharded"]["traffic"]["sent"] + runs[0]["ps_sharded"]["traffic"]["received"]), rel=0.01)


def test_one_parameter_server_round_equals_the_numpy_simulation_at_two_ranks(checks):
    for key, servers in (("ps0", 0), ("ps1", 1)):
        rounds = [r["rounds"][key] for r in checks]
        expected, _ = ps.ps_round([r["grad"] for r in rounds], rounds[0]["start"], servers,
                                  lambda _s, p, g: p - 0.5 * g)
        for rank, r in enumerate(rounds):
            np.testing.assert_allclose(r["after"], expected[rank], atol=1e-5)
            # float32 on the wire: the counted bytes are the simulation's for 18 float32 elements
            assert r["traffic"]["sent"] == ps.traffic(18, 4, 2, servers).sent[rank]
            assert r["traffic"]["received"] == ps.traffic(18, 4, 2, servers).received[rank]
            assert r["traffic"]["rounds"] == 1


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
        assert _max_diff(checks[0]["shards"][servers]["params"], checks[1]["shards"][servers]["params"]) == 0.0
