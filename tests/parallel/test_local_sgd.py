"""Local SGD (``sync.mode: local_sgd``) on real Horovod workers (2 processes, Gloo), one job per framework.

Each job trains synchronous SGD, local SGD with H = 4 and H = 8 and post-local SGD (8 synchronous steps, then
H = 4) from the same start over the same samples, records every rank's parameter fingerprint after every step, and
runs the user's own path (torch: a hand-written loop with Adam; Keras: ``compile``/``fit``); see
tests/parallel/local_sgd_workers.py. Rounds are what the optimizers counted as they issued the all-reduces.
"""
import cloudpickle
import pytest

from hvdsync import launch
from hvdsync.core.comm.schemes import local_sgd
from tests.parallel import local_sgd_workers

cloudpickle.register_pickle_by_value(local_sgd_workers)

PERIODS = {"h4": (4, 0), "h8": (8, 0), "post": (4, 8)}


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def job(request):
    fn = local_sgd_workers.run_torch if request.param == "torch" else local_sgd_workers.run_tensorflow
    results = launch.run(fn, np=2, progress=False)
    assert [r["size"] for r in results] == [2, 2]
    return results


def test_rounds_counted_are_steps_over_h(job):
    runs = job[0]["runs"]
    steps = runs["sync"]["steps"]
    assert steps == 88
    assert runs["sync"]["rounds"] == steps                            # one gradient all-reduce per step
    assert runs["h4"]["rounds"] == steps // 4 == 22                   # 4x fewer, counted
    assert runs["h8"]["rounds"] == steps // 8 == 11
    assert runs["post"]["rounds"] == local_sgd.rounds(steps, 4, 8) == 8 + 80 // 4
    for r in job:                                                     # both ranks issued the same rounds
        assert {k: v["rounds"] for k, v in r["runs"].items()} == {k: v["rounds"] for k, v in runs.items()}


def test_parameters_equal_right_after_each_averaging_and_apart_in_between(job):
    for name, (period, warmup) in PERIODS.items():
        a, b = (r["runs"][name]["fingerprints"] for r in job)
        assert len(a) == len(b) == 88
        for t in range(1, 89):
            same = a[t - 1] == b[t - 1]
            if local_sgd.synchronous(t, warmup) or local_sgd.averages_after(t, period, warmup):
                assert same, (name, t, a[t - 1], b[t - 1])
            else:
                assert not same, (name, t, a[t - 1], b[t - 1])
    a, b = (r["runs"]["sync"]["fingerprints"] for r in job)
    assert a == b                                                     # synchronous: equal after every step


def test_local_sgd_accuracy_within_two_points_of_synchronous(job):
    runs = job[0]["runs"]
    assert runs["sync"]["accuracy"] > 0.9                             # it trained
    for name in PERIODS:
        assert abs(runs[name]["accuracy"] - runs["sync"]["accuracy"]) <= 0.02, (name, runs[name]["accuracy"])
        assert runs[name]["spread"] == 0.0                            # the last step (88) was an averaging


def test_the_users_own_path(job):
    users = [r["user"] for r in job]
    assert users[0]["rounds"] == users[1]["rounds"] == 12 // 4
    if "rank_diffs" in users[0]:                                       # torch: parameters and Adam's moments
        diffs = users[0]["rank_diffs"]
        assert len(diffs) == 12
        assert [t for t, d in enumerate(diffs, 1) if d == 0.0] == [4, 8, 12], f"rank 0 - rank 1 per step: {diffs}"
        assert users[0]["resumed_steps"] == 12
        assert users[0]["resumed_moments_diff"] == 0.0
    else:                                                              # Keras fit: per-batch fingerprints
        a, b = users[0]["fingerprints"], users[1]["fingerprints"]
        assert len(a) == len(b) == 12
        assert [t for t, (x, y) in enumerate(zip(a, b), 1) if x == y] == [4, 8, 12], f"rank 0 {a}, rank 1 {b}"
