"""The cost model (hvdlab.costmodel): formulas agree with the simulations' counted bytes, the fit recovers
known figures, and the patterns rank as the theory says."""
import doctest
from dataclasses import replace

import numpy as np
import pytest

from hvdlab import costmodel
from hvdlab.costmodel import FABRICS, Link, busiest_rank_bytes, fit_link, predict, prediction_ratios
from hvdlab.ring import ring_allreduce

MiB = 2**20


def test_docstring_examples():
    assert doctest.testmod(costmodel).failed == 0


def test_fit_recovers_alpha_beta_from_noisy_times_and_predicts_within_a_few_percent():
    truth = Link(alpha=80e-6, beta=1 / 3e9, gamma=1 / 10e9)
    sizes = [s * MiB for s in (1, 2, 4, 8, 16, 32, 64)]
    rng = np.random.default_rng(0)
    times = [predict("ring", s, 2, truth) * rng.uniform(0.95, 1.05) for s in sizes]
    fit = fit_link(sizes, times, 2, gamma=truth.gamma)
    assert fit.alpha == pytest.approx(truth.alpha, rel=0.5)
    assert fit.beta == pytest.approx(truth.beta, rel=0.1)
    ratios = prediction_ratios(fit, sizes, times, 2)
    assert np.all(np.abs(ratios - 1) < 0.1)


def test_fit_keeps_alpha_non_negative():
    sizes = [MiB, 8 * MiB, 64 * MiB]
    fit = fit_link(sizes, [s * 1e-9 * 0.9 for s in sizes], 2)       # pure bandwidth, a little below zero latency
    assert fit.alpha >= 0 and fit.beta > 0


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="pattern"):
        predict("hypercube", 1, 2, Link(0, 0))
    with pytest.raises(ValueError, match="servers"):
        predict("ps", 1, 4, Link(0, 0), servers=5)
    with pytest.raises(ValueError, match="n:"):
        fit_link([1, 2], [1, 2], 1)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_ring_bytes_match_the_ring_simulation_and_sharded_ps_equals_the_ring(n):
    arrays = [np.ones(n * 64, dtype=np.float32) for _ in range(n)]
    trace = ring_allreduce(arrays)
    assert trace.bytes_sent.tolist() == [busiest_rank_bytes("ring", arrays[0].nbytes, n)] * n
    link = Link(20e-6, 1e-9, 1e-10)
    assert predict("sharded_ps", 64 * MiB, n, link) == pytest.approx(predict("ring", 64 * MiB, n, link))


def test_the_single_server_is_the_bottleneck_and_gossip_is_constant_in_the_world_size():
    link = Link(20e-6, 1e-9)
    s = 100 * MiB
    for n in (4, 8, 16, 64):
        assert busiest_rank_bytes("ps", s, n) / busiest_rank_bytes("ring", s, n) == pytest.approx(n / 2)
        assert predict("ps", s, n, link) > predict("ring", s, n, link)
        assert busiest_rank_bytes("gossip", s, n) == 2 * s
    assert predict("gossip", s, 64, link) == predict("gossip", s, 4, link)
    # Latency-bound messages favour few steps (tree, recursive doubling); bandwidth-bound ones the ring.
    assert predict("tree", 1024, 64, link) < predict("ring", 1024, 64, link)
    assert predict("ring", s, 64, link) < predict("tree", s, 64, link)


def test_fabric_table_orders_fabrics_by_bandwidth():
    rows = costmodel.fabric_table(100 * MiB, 8)
    assert [r["fabric"] for r in rows] == [f.name for f in FABRICS]
    ring_times = [r["ring"] for r in rows]
    bandwidths = [f.bandwidth for f in FABRICS]
    assert np.argmin(ring_times) == np.argmax(bandwidths) and np.argmax(ring_times) == np.argmin(bandwidths)
    assert all(f.source for f in FABRICS)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_as_horovod_runs_it_the_sharded_ps_is_the_ring_plus_one_call_and_one_server_is_the_bottleneck(n):
    link = Link(alpha=40e-6, beta=1 / 2e9, gamma=1 / 8e9, call=1.5e-3)
    s = 64 * MiB
    ring = costmodel.horovod_time("ring", s, n, link)
    assert costmodel.horovod_time("sharded_ps", s, n, link) == pytest.approx(ring + link.call)
    assert costmodel.horovod_time("sharded_ps", s, n, link) == pytest.approx(
        costmodel.horovod_time("push", s, n, link) + costmodel.horovod_time("pull", s, n, link))
    # The same bytes as the ring through rank 0; one server receives (n-1) whole buffers.
    assert costmodel.horovod_rank0_bytes("sharded_ps", s, n) == costmodel.horovod_rank0_bytes("ring", s, n)
    sent, received = costmodel.horovod_rank0_bytes("ps", s, n)
    assert received == (n - 1) * s and received / costmodel.horovod_rank0_bytes("ring", s, n)[1] == n / 2
    assert costmodel.horovod_time("ps", s, n, link) > costmodel.horovod_time("sharded_ps", s, n, link)
    with pytest.raises(ValueError, match="pattern"):
        costmodel.horovod_time("hypercube", s, n, link)


def test_fit_with_a_measured_call_cost_recovers_the_link_behind_it():
    truth = Link(alpha=60e-6, beta=1 / 1.5e9, gamma=1 / 8e9, call=2e-3)
    sizes = [s * MiB for s in (1, 2, 4, 8, 16, 32, 64)]
    times = [costmodel.horovod_time("ring", s, 2, truth) for s in sizes]
    fit = fit_link(sizes, times, 2, gamma=truth.gamma, call=truth.call)
    assert fit.call == truth.call
    assert fit.alpha == pytest.approx(truth.alpha, rel=1e-6) and fit.beta == pytest.approx(truth.beta, rel=1e-6)
    # Without the call term the fit puts it into alpha (two messages per 2-rank ring: call / 2 each).
    assert fit_link(sizes, times, 2, gamma=truth.gamma).alpha == pytest.approx(truth.alpha + truth.call / 2)
    # Fresh memory measured per size (cheap below glibc's mmap threshold, page faults above) is taken out too.
    mus = [1e-11 if s < 32 * MiB else 2e-9 for s in sizes]
    times = [costmodel.horovod_time("ring", s, 2, replace(truth, mu=m)) for s, m in zip(sizes, mus)]
    fit = fit_link(sizes, times, 2, gamma=truth.gamma, call=truth.call, mu=mus)
    assert fit.beta == pytest.approx(truth.beta, rel=1e-6) and fit.alpha == pytest.approx(truth.alpha, rel=1e-6)
    # The sharded PS allocates 2 + 1/n buffers where the ring allocates one.
    link = replace(truth, mu=2e-9)
    assert costmodel.horovod_time("sharded_ps", 64 * MiB, 2, link) - costmodel.horovod_time("ring", 64 * MiB, 2, link) \
        == pytest.approx(truth.call + 1.5 * 64 * MiB * 2e-9)
