"""Horovod's own TensorFlow 2 / Keras API over Keras 3 (hvdsync's Horovod build, patch 0008) on 2 real workers.

One launch runs every check (tests/parallel/horovod_keras3_workers.py: TensorFlow's import is the slow part); the
tests below assert on the numbers it brings back: both ranks equal, and equal to one process on the global batch.
Two more launches run the plain example scripts under ``horovodrun``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from hvdsync.launch.local import horovod_frameworks, run
from tests.parallel import horovod_keras3_workers as workers

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# float32 sums in another order (allreduce vs one batch) differ by ~1e-7; a wrong scale, a missed shard or a
# skipped update moves the weights by 1e-2 or more.
TOL = 1e-5
# fp16 on the wire: each gradient rounded to 11 significant bits (relative 2**-11 ~ 5e-4) for 3 steps.
FP16_TOL = 1e-3

pytestmark = pytest.mark.skipif("tensorflow" not in horovod_frameworks(), reason="Horovod built without TensorFlow")

cloudpickle.register_pickle_by_value(workers)


def _diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in
               zip(a, b, strict=True))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keras3")
    # dynamic process sets: the tape check adds one process set per rank
    results = run(workers.run_all, kwargs={"tmp_dir": str(tmp)}, np=2, progress=False, log_dir=tmp,
                  env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}, timeout=600)
    assert [r["rank"] for r in results] == [0, 1] and results[0]["size"] == 2
    return results


def _both(ranks, check, key):
    return ranks[0][check][key], ranks[1][check][key]


@pytest.mark.parametrize("key", ["dense", "groups", "process_set_global"])
def test_distributed_gradient_tape_equals_one_process_on_the_global_batch(ranks, key):
    r0, r1 = _both(ranks, "tape", key)
    ref = ranks[0]["tape"]["reference"]
    assert _diff(r0, r1) == 0.0
    assert _diff(r0, ref) < TOL
    assert _diff(ref, ranks[0]["tape"]["start"]) > 0.1  # 3 steps moved the weights


def test_tape_fp16_compression_is_close_to_fp32(ranks):
    r0, r1 = _both(ranks, "tape", "fp16")
    assert _diff(r0, r1) == 0.0
    assert 0.0 < _diff(r0, ranks[0]["tape"]["dense"]) < FP16_TOL  # rounded on the wire, not skipped


def test_tape_and_optimizer_on_a_one_rank_process_set_keep_the_ranks_own_gradient(ranks):
    for r in ranks:
        assert _diff(r["tape"]["process_set_alone"], r["tape"]["local_only"]) == 0.0
        assert _diff(r["tape"]["optimizer_process_set_alone"], r["tape"]["local_only"]) < TOL
    assert _diff(ranks[0]["tape"]["process_set_alone"], ranks[1]["tape"]["process_set_alone"]) > 0.1


def test_partial_tape_keeps_local_layer_gradients_scaled_by_size(ranks):
    for r in ranks:
        t = r["tape"]
        # layer 0 local: the rank's own gradient / 2 (scale_local_gradients); layer 1: the global batch's
        want = [t["partial_own"][0] / 2, t["partial_own"][1] / 2, *t["partial_global"][2:]]
        assert _diff(t["partial"], want) < TOL
    assert _diff(ranks[0]["tape"]["partial"][:2], ranks[1]["tape"]["partial"][:2]) > 1e-3


@pytest.mark.parametrize("key", ["sparse", "sparse_as_dense", "keras_sparse_as_dense"])
def test_embedding_gradients_sparse_and_as_dense(ranks, key):
    r0, r1 = _both(ranks, "sparse", key)
    assert _diff(r0, r1) == 0.0
    assert _diff(r0, ranks[0]["sparse"]["reference"]) < TOL
    # the sparse path really carried IndexedSlices (allgathered), not a densified tensor
    assert ranks[0]["sparse"]["sparse_kinds"] == ["IndexedSlices", "IndexedSlices"]


@pytest.mark.parametrize("key", ["sgd_fit", "sgd_fit_keras", "adam_fit", "adam_fit_keras"])
def test_distributed_optimizer_in_compile_fit(ranks, key):
    r0, r1 = _both(ranks, "optimizer", key)
    o = ranks[0]["optimizer"]
    assert _diff(r0, r1) == 0.0
    assert _diff(r0, o[key.split("_")[0] + "_reference"]) < TOL
    assert _diff(r0, o["start"]) > 1e-2


def test_distributed_optimizer_apply_gradients_in_a_custom_loop(ranks):
    r0, r1 = _both(ranks, "optimizer", "loop")
    assert _diff(r0, r1) == 0.0 and _diff(r0, ranks[0]["optimizer"]["loop_reference"]) < TOL


@pytest.mark.parametrize("average", [True, False])
def test_backward_passes_per_step_aggregates_two_passes_into_one_update(ranks, average):
    for r in ranks:
        o = r["optimizer"]
        first, second = o[f"agg_{average}_after_pass"]
        assert _diff(first, o["start"]) == 0.0  # the first pass only aggregates
        # one update = one process's step on the 16 samples (lr x2 without averaging: the sum of 2 means)
        assert _diff(second, o[f"agg_{average}_reference"]) < TOL
        assert _diff(second, o["start"]) > 1e-2
        assert o[f"agg_{average}_iterations"] == 2  # Keras counts both passes, as Horovod's Keras 2 wrapper did
    assert _diff(ranks[0]["optimizer"]["agg_fit"], ranks[1]["optimizer"]["agg_fit"]) == 0.0
    assert _diff(ranks[0]["optimizer"]["agg_fit"], ranks[0]["optimizer"]["agg_fit_reference"]) < TOL


@pytest.mark.parametrize("module", ["tfkeras", "keras"])
def test_partial_distributed_optimizer_keeps_local_variables_local(ranks, module):
    for r in ranks:
        o = r["optimizer"]
        want = [o["start"][i] - workers.LR * (o["partial_own_grads"][i] / 2 if i < 2 else o["partial_global_grads"][i])
                for i in range(4)]
        assert _diff(o[f"partial_{module}"], want) < TOL
    p0, p1 = ranks[0]["optimizer"][f"partial_{module}"], ranks[1]["optimizer"][f"partial_{module}"]
    assert _diff(p0[2:], p1[2:]) == 0.0 and _diff(p0[:2], p1[:2]) > 1e-3


def test_broadcast_variables_gives_every_rank_root_weights(ranks):
    c0, c1 = ranks[0]["callbacks"], ranks[1]["callbacks"]
    assert _diff(c0["bcast_before"], c1["bcast_before"]) > 0.1  # different initial weights
    assert _diff(c1["bcast_after"], c0["bcast_before"]) == 0.0 and _diff(c0["bcast_after"], c0["bcast_before"]) == 0.0


def test_broadcast_callback_starts_fit_from_root_weights(ranks):
    c0, c1 = ranks[0]["callbacks"], ranks[1]["callbacks"]
    assert _diff(c0["bcast_fit"], c1["bcast_fit"]) == 0.0
    # = one process from rank 0's initial weights: the broadcast happened before the first step
    assert _diff(c0["bcast_fit"], c0["bcast_fit_reference"]) < TOL


def test_metric_average_callback_logs_the_mean_of_the_ranks(ranks):
    raw = np.array([r["callbacks"]["metric_raw"] for r in ranks])
    assert np.abs(raw[0] - raw[1]).max() > 1e-2  # the shards' losses differ
    for r in ranks:
        assert np.allclose(r["callbacks"]["metric_averaged"], raw.mean(axis=0), rtol=1e-6, atol=0)


def test_learning_rate_warmup_and_schedule_callbacks_set_the_optimizers_rate(ranks):
    c = ranks[0]["callbacks"]
    size, steps, warmup, lr = 2, 2, 2, 0.4
    want = []
    for epoch in range(3):
        for batch in range(steps):
            if epoch < warmup:  # Horovod's warmup: lr/size rising to lr; epoch counted at the batch's end
                e = epoch + batch / steps + 1 / steps
                want.append(lr / size * (e * (size - 1) / warmup + 1))
            else:
                want.append(lr)
    assert np.allclose(c["warmup_lrs"], want, rtol=1e-6)
    assert np.allclose(c["warmup_logged"], [0.3, 0.4, 0.4], rtol=1e-6)
    # schedule: x0.5 per epoch from start_epoch=1 (staircase: set at each epoch's first batch)
    assert np.allclose(c["schedule_lrs"], [0.4, 0.4, 0.4, 0.4, 0.2, 0.2], rtol=1e-6)
    assert ranks[1]["callbacks"]["warmup_lrs"] == c["warmup_lrs"]


def test_best_model_checkpoint_and_load_model_rewrap_the_optimizer(ranks):
    c = ranks[0]["callbacks"]
    assert c["loaded_weights_diff"] == 0.0  # the loss fell every epoch: the best model is the last one
    # Horovod's class named like the optimizer, subclassing Keras' (so a plain Keras load works too)
    assert c["loaded_optimizer"] == ["horovod._keras", "Adam", "keras.src.optimizers.adam"]
    assert c["loaded_iterations"] == 4  # the optimizer's state came back with it


def test_sync_batch_normalization_uses_both_ranks_statistics(ranks):
    for r in ranks:
        c = r["callbacks"]
        assert _diff([c["sync_bn_out"]], [c["sync_bn_ref_out"]]) < TOL
        assert _diff(c["sync_bn_moving"], c["sync_bn_ref_moving"]) < TOL


def test_keras2_only_calls_fail_with_one_line_naming_the_keras3_way(ranks):
    k = ranks[0]["keras2"]
    for method in ("get_gradients", "compute_gradients"):
        assert k[method] == (
            f"AttributeError: SGD.{method}() does not exist for Keras 3 optimizers: compute the gradients with "
            "tf.GradientTape (or hvd.DistributedGradientTape) and pass them to "
            "optimizer.apply_gradients(zip(grads, variables)); the Horovod DistributedOptimizer allreduces them there.")
    assert k["legacy_opts"] == ("ValueError: load_model(legacy_opts=True): keras.optimizers.legacy does not exist in "
                                "Keras 3; load the model with legacy_opts=False (Keras 3 optimizers).")
    assert all("\n" not in v for v in k.values())


@pytest.mark.parametrize("script", ["horovod_keras_fit.py", "horovod_tf2_tape.py"])
def test_plain_example_scripts_under_horovodrun(tmp_path, script):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           str(REPO / "examples/plain" / script), "--out", str(tmp_path / "w")]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    w0, w1, start = (list(np.load(tmp_path / f"w.{name}.npz").values()) for name in ("rank0", "rank1", "start"))
    assert _diff(w0, w1) == 0.0  # both ranks hold the same weights
    assert _diff(w0, start) > 1e-2  # and training moved them
