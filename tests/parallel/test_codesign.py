"""Co-design with the model on real Horovod workers (2 processes, Gloo), in both frameworks: sparse gradients of a
100k-row embedding table (sync.sparse allgather against dense) and synchronised against local batch norm.

One worker job per framework (tests/parallel/codesign_workers.py); each test asserts one promise.
"""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from hvdsync.core.comm import sparse
from tests.parallel import codesign_workers

cloudpickle.register_pickle_by_value(codesign_workers)


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def checks(request):
    results = launch.run(codesign_workers.all_checks, args=(request.param,), np=2, progress=False)
    assert len(results) == 2
    for r in results:  # shown with pytest -s (and on failure)
        none = r["none"]
        print(f"{request.param:<10} rank {none['rank']}: bytes allgather {none['modes']['allgather']['bytes']:,} "
              f"dense {none['modes']['dense']['bytes']:,}; gradient difference {none['grad_difference']:.2e}, "
              f"parameters {none['param_difference']:.2e}")
    return {"framework": request.param, "ranks": results}


def test_allgather_gives_the_dense_reduction(checks):
    for r in checks["ranks"]:
        for codec in ("none", "fp16"):
            run = r[codec]
            # The same sum; float32: only the order of additions may differ (PyTorch coalesces duplicate lookups);
            # fp16: the dense all-reduce rounds its sum to float16 (10 bits), the allgather adds in float32.
            relative = 1e-6 if codec == "none" else 1e-3
            assert run["grad_difference"] <= relative * run["grad_scale"], codec
            assert run["param_difference"] <= (1e-5 if codec == "none" else 1e-2), codec


def test_counted_bytes_equal_the_formula_and_are_50x_below_dense(checks):
    for r in checks["ranks"]:
        for codec in ("none", "fp16"):
            run = r[codec]
            counted = {mode: run["modes"][mode]["bytes"] for mode in ("allgather", "dense")}
            assert counted["allgather"] == run["formula"]["allgather"], codec
            assert counted["dense"] == run["formula"]["dense"], codec
            assert counted["dense"] / counted["allgather"] >= 50, codec
        # what the formula stands for: a few hundred distinct rows of a 100k x 16 table per step
        assert all(100 <= rows <= 300 for rows in r["none"]["distinct_rows"]), r["none"]["distinct_rows"]
        assert r["none"]["formula"]["table_dense"] == 3 * sparse.dense_bytes(100_000, 16)
        assert r["none"]["modes"]["allgather"]["dtypes"] == ["float32", "int32"]
        assert r["fp16"]["modes"]["allgather"]["dtypes"] == ["float16", "int32"]


def test_parameters_identical_across_ranks(checks):
    for r in checks["ranks"]:
        for codec in ("none", "fp16", "topk"):
            for mode, run in r[codec]["modes"].items():
                assert run["spread"] == 0.0, (codec, mode)
        # Top-k densifies the sparse gradient and then sends only its largest 1 %: fewer bytes than the dense
        # float32 all-reduce, and not none (this compared the value with itself before).
        topk, dense = r["topk"]["modes"]["dense"]["bytes"], r["none"]["modes"]["dense"]["bytes"]
        assert 0 < topk < dense, (topk, dense)


def test_tensorflow_hands_over_indexed_slices(checks):
    if checks["framework"] == "tensorflow":
        for mode, run in checks["ranks"][0]["none"]["modes"].items():
            assert run["gradient_types"] == ["IndexedSlices"], mode   # a Keras Embedding's gradient is sparse


def test_sync_batch_norm_takes_the_global_batch_statistics_and_local_does_not(checks):
    ranks = [r["bn"] for r in checks["ranks"]]
    for r in ranks:
        np.testing.assert_allclose(r["sync"]["mean"], r["global_mean"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r["sync"]["var"], r["global_var"], rtol=1e-5, atol=1e-5)
        assert np.abs(np.subtract(r["local"]["mean"], r["global_mean"])).max() > 0.1
    # local batch norm leaves each rank with its own statistics; synchronised, both hold the same
    assert np.abs(np.subtract(ranks[0]["local"]["mean"], ranks[1]["local"]["mean"])).max() > 0.1
    assert ranks[0]["sync"] == ranks[1]["sync"]


def test_the_other_paths_take_sparse_gradients(checks):
    other = [r["other"] for r in checks["ranks"]]
    if checks["framework"] == "torch":   # densified for the parameter server, local SGD and a reducing codec
        assert len(other[0]) == 4 and all(spread == 0.0 for spread in other[0].values()), other[0]
    else:   # Keras compile/fit with sync.sparse allgather: the same ids, the same bytes as the hand-written loop
        for r, o in zip(checks["ranks"], other):
            assert o["spread"] == 0.0 and o["dtypes"] == ["float32", "int32"]
            assert o["bytes"] == r["none"]["modes"]["allgather"]["bytes"]
