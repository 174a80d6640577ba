"""The grouped all-reduce after backward (``sync.grouped_mb``) on real Horovod workers: the same parameters as
Horovod's per-tensor hooks, on every rank, through the adapter API and ``fit``; one 2-worker job for all tests."""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from tests.parallel import grouped_workers

cloudpickle.register_pickle_by_value(grouped_workers)


@pytest.fixture(scope="module")
def runs():
    results = launch.run(grouped_workers.run_checks, np=2, progress=False)
    assert [r["rank"] for r in results] == [0, 1] and results[0]["size"] == 2
    return results


def _max_diff(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def test_the_rule_picks_grouped_for_a_small_model_and_hooks_above_the_threshold(runs):
    r = runs[0]
    assert r["grouped"]["kind"] == "GroupedOptimizer"
    assert r["grouped_fp16"]["kind"] == "GroupedOptimizer"
    assert r["hooks"]["kind"] == r["over_threshold"]["kind"] == "hooks"


def test_a_gradient_over_the_first_bucket_starts_a_bucket_of_its_own(runs):
    # backward order: output bias, output weight, hidden bias (13.6 kB together), then the 1.07 MB hidden weight
    assert runs[0]["buckets"]["buckets"] == runs[0]["buckets_acc"]["buckets"] == [3, 1]
    assert runs[0]["grouped"]["buckets"] == [len(runs[0]["grouped"]["start"])]   # the CNN: one bucket


@pytest.mark.parametrize("name", ["grouped", "grouped_fp16", "grouped_sum", "grouped_acc", "grouped_unnamed",
                                  "fit_grouped", "buckets", "buckets_acc", "buckets_fp16"])
def test_parameters_stay_equal_across_ranks(runs, name):
    assert _max_diff(runs[0][name]["params"], runs[1][name]["params"]) == 0.0


@pytest.mark.parametrize("grouped, hooks", [("grouped", "hooks"), ("grouped_fp16", "hooks_fp16"),
                                            ("grouped_acc", "hooks_acc"), ("grouped_unnamed", "hooks"),
                                            ("grouped_sum", "hooks"), ("fit_grouped", "fit_hooks"),
                                            ("buckets", "hooks_mlp"), ("buckets_acc", "hooks_mlp_acc"),
                                            ("buckets_fp16", "hooks_mlp_fp16")])
def test_grouped_ends_where_the_hooks_end(runs, grouped, hooks):
    # Two ranks: each element is the same sum of two addends whichever path reduces it, so the parameters agree
    # bit for bit (op sum at half the learning rate is the average at the full one, up to rounding).
    r = runs[0]
    start = r["buckets" if grouped.startswith("buckets") else "grouped"]["start"]
    assert _max_diff(r[hooks]["params"], start) > 1e-3   # it trained
    assert _max_diff(r[grouped]["params"], r[hooks]["params"]) <= (1e-6 if grouped == "grouped_sum" else 0.0)


def test_the_wire_counts_the_same_tensors_and_bytes(runs):
    r = runs[0]
    for grouped, hooks in (("grouped", "hooks"), ("grouped_fp16", "hooks_fp16"), ("grouped_acc", "hooks_acc"),
                           ("buckets", "hooks_mlp"), ("buckets_acc", "hooks_mlp_acc")):
        counted = ("tensors", "bytes", "dtypes")   # not codec_seconds: a timing
        assert {k: r[grouped]["wire"][k] for k in counted} == {k: r[hooks]["wire"][k] for k in counted}
    assert r["grouped"]["wire"]["bytes"] == 4 * r["grouped"]["numel"] * 4       # 4 steps of float32
    assert r["grouped_fp16"]["wire"]["dtypes"] == ["float16"]
    assert r["grouped_acc"]["wire"]["bytes"] == r["grouped"]["wire"]["bytes"]   # one round per step, not per pass
