"""Sync modes (parameter server, gossip) and the overlap probe on real Horovod workers (2 processes, Gloo).

One pair of workers trains every mode and runs one round of each against the numpy simulation at W = 2
(tests/parallel/schemes_workers.py); two more jobs run the overlap probe under Horovod's timeline at two fusion
thresholds. World size 2 makes the ring and the neighbour exchange coincide: the 4- and 8-rank behaviour is
tested on the numpy simulations (tests/unit/test_schemes.py).
"""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from hvdsync.config import SyncConfig
from hvdsync.core.telemetry import timeline
from hvdsync.core.comm.schemes import gossip
from hvdlab.torch import overlap
from tests.parallel import ps_checks, schemes_workers

cloudpickle.register_pickle_by_value(schemes_workers)


@pytest.fixture(scope="module")
def checks():
    results = launch.run(schemes_workers.run_checks, np=2, progress=False)
    assert [r["size"] for r in results] == [2, 2]
    return results


def test_sharded_and_single_parameter_servers_reach_the_ring_parameters(checks):
    ps_checks.reach_the_ring(checks[0]["runs"])


def test_bytes_through_rank_0_single_server_vs_sharded_vs_ring_counted(checks):
    ps_checks.bytes_counted([r["runs"] for r in checks])


def test_one_round_of_each_mode_equals_the_numpy_simulation_at_two_ranks(checks):
    ps_checks.rounds_match_the_simulation(checks)
    rounds = [r["rounds"]["gossip0"] for r in checks]
    mixed = gossip.mix([r["start"] for r in rounds])
    for rank, r in enumerate(rounds):
        np.testing.assert_allclose(r["after"], mixed[rank] - 0.5 * r["grad"], atol=1e-5)
        assert r["traffic"]["sent"] == gossip.traffic(18, 4, 2).sent[rank]


def test_gossip_consensus_distance_shrinks_and_accuracy_is_within_two_points(checks):
    runs = checks[0]["runs"]
    for name, period in (("gossip", 1), ("gossip_h4", 4)):
        records = runs[name]["consensus"]
        assert len(records) == -(-runs[name]["steps"] // period)       # one mixing every `period` steps
        later = records[1:]
        assert [r for r in later if not r[2] < r[1]] == []            # every mixing pulls the ranks together
        assert [r for r in later if not r[2] < 1e-6] == []            # with W = 2 it is an exact average
        assert max(before for _, before, _ in later) > 1e-4          # the local steps had pulled them apart
        assert abs(runs[name]["accuracy"] - runs["allreduce"]["accuracy"]) <= 0.02, name
    assert runs["gossip_h4"]["traffic"]["rounds"] * 4 >= runs["gossip"]["traffic"]["rounds"]
    assert runs["gossip_h4"]["traffic"]["sent"] < runs["gossip"]["traffic"]["sent"] / 3


def test_every_measured_pattern_returns_the_right_result(checks):
    for r in checks:
        assert r["measured_wrong"] == {p: 0 for p in ("ring", "sharded_ps", "ps", "gossip")}


def test_the_sharded_push_of_64_mib_is_exact_every_time(checks):
    # Regression check for the race in the push it replaced (hvd.reducescatter: rank 0 wrong in ~1 of 5 rounds).
    assert [r["big_pushes_wrong"] for r in checks] == [0, 0]


# ---- overlap, through Horovod's timeline ----------------------------------------------------------------------
SMALL = {"small": 64, "big": 384, "n_small": 2, "n_big": 3}


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    out = {}
    for mb in (0, 64):
        path = tmp_path_factory.mktemp("timeline") / f"fusion{mb}.json"
        rows = launch.run(overlap.probe, kwargs={"batch": 128, "steps": 3, "warmup": 1, **SMALL}, np=2,
                          sync=SyncConfig(fusion_threshold_mb=mb), env={"HOROVOD_TIMELINE": str(path)},
                          progress=False)[0]
        out[mb] = (rows, timeline.read(path))
    return out


def test_the_timeline_shows_every_gradient_and_the_overlap_of_each_variant(probes):
    for mb, (rows, tl) in probes.items():
        for row in rows:
            spans = tl.select(op="ALLREDUCE", name=row["bytes"].__contains__, between=row["segment"])
            assert {s.name for s in spans} == set(row["bytes"]), (mb, row["order"], row["variant"])
            assert len(spans) >= 3 * len(row["bytes"])              # every gradient, every timed step
            row["hidden"] = timeline.overlap(spans, row["backward"])
            assert 0.0 <= row["hidden"] <= 1.0
            if row["variant"] == "after_backward":
                # Handed over only after backward returned: nothing can hide (up to the skew between Horovod's
                # clock and Python's). How much the hooks hide is a timing, shown in notebook 07, not asserted.
                assert row["hidden"] < 0.05, (mb, row["order"], row["hidden"])
                assert min(s.start for s in spans) >= row["backward"][0][1] - 1e-3
