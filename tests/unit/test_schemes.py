"""Sync modes in the core: the numpy parameter server and gossip at 4 and 8 ranks, their byte counts, and the
config errors for impossible combinations."""
import doctest

import numpy as np
import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.comm import schemes
from hvdsync.core.train.data import digits
from hvdlab import sim
from hvdsync.core.comm.schemes import gossip, ps


@pytest.fixture(scope="module")
def data():
    return digits()


def test_docstring_examples():
    for module in (schemes, ps, gossip, sim):
        assert doctest.testmod(module).failed == 0, module.__name__


@pytest.mark.parametrize("world", [4, 8])
def test_parameter_servers_reach_the_ring_all_reduce_parameters(data, world):
    steps = 2 * (len(data.x_train) // (world * 16))
    ring_run = sim.simulate("allreduce", data, world, steps)
    for servers in (0, 1, 3):
        ps_run = sim.simulate("ps", data, world, steps, servers=servers)
        for r in range(world):
            assert np.max(np.abs(ps_run.params[r] - ring_run.params[0])) < 1e-12, (servers, r)
    assert ring_run.accuracy[0] > 0.8


@pytest.mark.parametrize("world", [4, 8])
def test_bytes_per_round_single_server_carries_w_minus_1_payloads_sharded_none(world):
    size, itemsize = 1000 * world, 4
    one = ps.traffic(size, itemsize, world, servers=1)
    sharded = ps.traffic(size, itemsize, world, servers=0)
    payload = size * itemsize
    # Rank 0 receives (W-1) gradients and sends (W-1) copies of the parameters ...
    assert one.received[0] == (world - 1) * payload and one.sent[0] == (world - 1) * payload
    # ... every other rank one of each; the sharded server moves what the ring moves, on every rank.
    assert np.all(one.sent[1:] == payload) and np.all(one.received[1:] == payload)
    ring_per_rank = 2 * (world - 1) / world * payload
    assert np.all(sharded.sent == ring_per_rank) and np.all(sharded.received == ring_per_rank)
    assert one.sent[0] / sharded.sent[0] == pytest.approx(world / 2)
    assert gossip.traffic(size, itemsize, world).sent.tolist() == [2 * payload] * world


@pytest.mark.parametrize("world", [4, 8])
def test_gossip_pulls_ranks_together_and_trains_close_to_all_reduce(data, world):
    steps = 3 * (len(data.x_train) // (world * 16))
    apart = sim.simulate("gossip", data, world, steps, init_spread=0.5)
    c = apart.consensus
    assert c[-1] < c[0] / 5 and c[steps // 2] < c[0]
    # A pure mixing round (no gradient) shrinks the distance by at most the contraction factor.
    xs = [np.random.default_rng(r).normal(size=50) for r in range(world)]
    assert gossip.consensus_distance(gossip.mix(xs)) <= gossip.contraction(world) * gossip.consensus_distance(xs) + 1e-12
    assert np.allclose(np.mean(gossip.mix(xs), axis=0), np.mean(xs, axis=0))          # the mean is kept
    ring_run = sim.simulate("allreduce", data, world, steps)
    every = sim.simulate("gossip", data, world, steps)
    assert abs(np.mean(every.accuracy) - ring_run.accuracy[0]) < 0.08


def test_two_ranks_gossip_is_an_exact_average_and_the_ring_mixes_slower_as_it_grows():
    xs = [np.array([1.0, 3.0]), np.array([3.0, 5.0])]
    assert [m.tolist() for m in gossip.mix(xs)] == [[2.0, 4.0], [2.0, 4.0]]
    assert gossip.neighbours(0, 2) == [1] and gossip.neighbours(0, 1) == []
    factors = [gossip.contraction(w) for w in (2, 3, 4, 8, 16, 32)]
    assert factors[0] == pytest.approx(0) and factors[1] == pytest.approx(0)
    assert factors[2:] == sorted(factors[2:]) and factors[-1] > 0.9


@pytest.mark.parametrize("raw,field", [
    ({"sync": {"mode": "parameter_server"}}, "sync.mode"),
    ({"sync": {"mode": "ps", "op": "adasum"}}, "sync.op"),
    ({"sync": {"mode": "gossip", "op": "sum"}}, "sync.op"),
    ({"sync": {"mode": "gossip", "compression": "fp16"}}, "sync.compression"),
    ({"sync": {"mode": "ps", "ps_servers": 3}, "train": {"np": 2}}, "sync.ps_servers"),
    ({"sync": {"ps_servers": 1}}, "sync.ps_servers"),
    ({"sync": {"period": 4}}, "sync.period"),
    ({"sync": {"mode": "gossip", "period": 0}}, "sync.period"),
    # TensorFlow's parameter server keeps no elastic state of its shards (PyTorch's gathers and re-cuts it)
    ({"sync": {"mode": "ps"}, "train": {"framework": "tensorflow"}, "elastic": {"enabled": True}}, "sync.mode"),
    ({"sync": {"mode": "gossip"}, "train": {"precision": "fp16"}}, "train.precision"),
])
def test_bad_modes_and_impossible_combinations_fail_in_the_config(raw, field):
    with pytest.raises(ConfigError) as err:
        Config.from_dict(raw)
    assert str(err.value).startswith(field + ":"), str(err.value)


def test_good_mode_settings_pass():
    Config.from_dict({"sync": {"mode": "ps", "ps_servers": 1, "compression": "fp16"}})
    Config.from_dict({"sync": {"mode": "gossip", "period": 4}})
    Config.from_dict({"sync": {"mode": "ps", "ps_servers": 1, "compression": "fp16"}, "train": {"framework": "tensorflow"}})
    Config.from_dict({"sync": {"mode": "ps"}, "elastic": {"enabled": True}})  # PyTorch's re-cuts its sharded state
