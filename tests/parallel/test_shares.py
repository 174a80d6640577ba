"""Straggler-aware shares and a growing batch on real Horovod workers (2 processes, Gloo), both frameworks.

One job per framework runs every check (tests/parallel/shares_workers.py); each test asserts one promise. Rank 1
computes 4x slower (the lab's straggler, ``hvdlab.straggler.SlowRank``, passed in by the workers). Speed is not
asserted here (a noisy machine): the epoch-time ratio is printed by benchmarks/shares.py and notebook 08.
"""
import math

import cloudpickle
import pytest

from hvdsync import launch
from tests.parallel import shares_workers

cloudpickle.register_pickle_by_value(shares_workers)

CHECKS = {"torch": shares_workers.torch_workers, "tensorflow": shares_workers.tensorflow_workers}


@pytest.fixture(scope="module", params=sorted(CHECKS))
def checks(request):
    results = launch.run(CHECKS[request.param], np=2, progress=False)
    assert len(results) == 2
    return results


def test_every_sample_is_read_exactly_once_per_epoch_with_adaptive_shares(checks):
    r = checks[0]
    assert len(r["reads_per_epoch"]) == shares_workers.EPOCHS
    assert all(set(epoch) == {1} for epoch in r["reads_per_epoch"])   # counted where the samples are read


def test_parameters_are_identical_across_ranks(checks):
    assert checks[0]["param_spread"] == 0.0 and checks[1]["param_spread"] == 0.0
    assert checks[0]["growth"]["param_spread"] == 0.0


def test_the_slow_rank_gets_fewer_samples_after_the_first_epoch(checks):
    r = checks[0]
    first, *later = r["rank_samples"]
    assert abs(first[0] - first[1]) <= 1                              # epoch 0: equal shares, nothing measured yet
    for samples, shares in zip(later, r["shares"][1:]):
        assert samples[1] < samples[0] and shares[1] < 0.45            # rank 1 (4x slower) reads fewer
        assert math.isclose(sum(shares), 1.0)
    assert checks[1]["rank_samples"] == r["rank_samples"]              # both ranks planned alike
    assert checks[1]["shares"] == r["shares"]


def test_the_evaluation_scores_every_test_sample_once_cut_by_the_shares_in_force(checks):
    from hvdsync.core.train.shares import split_counts

    r = checks[0]
    assert all(set(epoch) == {1} for epoch in r["test_reads_per_epoch"])   # counted where the samples are read
    for scored, shares in zip(r["test_rank_samples"], r["shares"]):
        assert scored == split_counts(r["test_size"], shares).tolist()    # the training steps' shares, per epoch
    assert r["test_rank_samples"][-1][1] < 0.45 * r["test_size"]          # the slow rank scores fewer


def test_tensorflow_traces_each_step_graph_once_while_the_shares_change_the_batch(checks):
    if "traces" not in checks[0]:
        pytest.skip("tf.function: TensorFlow only")
    # The step's one graph (its pass, all-reduce and update) and the evaluation's: traced once on each rank. The
    # slowed rank times its first pass apart (three graphs, once) before its slowdown is measured; none retraces.
    for r in checks:
        assert r["traces"]["step_first"] == 1 and r["traces"]["predict"] == 1, r["traces"]
        assert max(r["traces"].values()) == 1, r["traces"]
    assert {checks[1]["traces"][k] for k in ("first_backward", "synchronize", "update")} == {1}, checks[1]["traces"]
    assert len({tuple(s) for s in checks[0]["rank_samples"]}) > 1       # the per-rank batch did change


def test_rebalance_in_your_own_loop_keeps_the_plan_promises(checks):
    r = checks[0]
    assert r["rebalanced"] == pytest.approx((2 / 3, 1 / 3)) and checks[1]["rebalanced"] == r["rebalanced"]
    assert set(r["own_loop_reads"]) == {1}                                # every sample once over both ranks
    low, high = sorted(r["own_loop_rank_samples"])
    assert r["own_loop_rank_samples"][1] == low and high > 1.9 * low      # rank 1 reads about half as many
    assert r["own_loop_steps"][0] == r["own_loop_steps"][1]               # the same number of (micro-)batches


def test_a_growing_batch_cuts_all_reduces_and_scales_the_learning_rate(checks):
    g = checks[0]["growth"]
    assert g["global_batch"] == [64, 128, 256]
    steps = [math.ceil(1348 / b) for b in g["global_batch"]]             # 1,348 digits in the training split
    assert g["sync_rounds"] == steps                                   # counted: tensors handed to Horovod / layers
    assert g["lrs"] == pytest.approx([0.05, 0.05 * 2 ** 0.5, 0.1])       # train.growth_lr: sqrt (default)
    assert g["accuracy"] >= 0.85


def test_a_growing_batch_through_keras_fit_reads_every_sample_once_and_scales_the_rate(checks):
    if "keras_growth" not in checks[0]:
        pytest.skip("Keras fit: TensorFlow only")
    g = checks[0]["keras_growth"]
    assert g["steps"] == [math.ceil(1348 / b) for b in (64, 128, 256)]      # the grown epochs end where the plan does
    assert all(set(epoch) == {1} for epoch in g["reads_per_epoch"])          # counted in the user's lookup
    assert g["lrs"] == pytest.approx([0.05, 0.05 * 2 ** 0.5, 0.1])            # train.growth_lr (sqrt), set by the sampler
    assert g["param_spread"] == 0.0 and checks[1]["keras_growth"]["param_spread"] == 0.0
    assert not [w for w in g["warnings"] if "ran out of data" in w]          # no false alarm from Keras per epoch
