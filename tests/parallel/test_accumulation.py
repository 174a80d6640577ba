"""One accumulation rule in both frameworks (hvdsync.adapter.ACCUMULATION_RULE), on real Horovod workers: the same
loop of a user's own (summed loss times ``loss_scale``, ``accumulate=2``), from the same initial weights on the same
global batches, ends where one process without Horovod ends on those global batches, in PyTorch and in TensorFlow.

Averaging the two passes instead of summing them (TensorFlow's optimizer did, by default, before the rule) applies
half the step: the same as the reference at half the learning rate, which the checks below tell apart.
"""
from __future__ import annotations

import cloudpickle
import numpy as np
import pytest

from hvdsync.launch.local import horovod_frameworks, run
from tests.parallel import accumulation_workers
from tests.parallel.accumulation_workers import EPOCHS, N, _max_diff

TOL = 1e-5  # float32 sums in another order differ by ~1e-7; half the step moves the weights by ~1e-1
cloudpickle.register_pickle_by_value(accumulation_workers)


def _needs(framework: str):
    return pytest.mark.skipif(framework not in horovod_frameworks(), reason=f"Horovod built without {framework}")


@pytest.fixture(scope="module")
def torch_ranks(tmp_path_factory):
    return run(accumulation_workers.torch_loops, np=2, progress=False, log_dir=tmp_path_factory.mktemp("acc-torch"))


@pytest.fixture(scope="module")
def tensorflow_ranks(tmp_path_factory):
    return run(accumulation_workers.tensorflow_loop, np=2, progress=False,
               log_dir=tmp_path_factory.mktemp("acc-tf"))


def _check(final, root) -> None:
    assert _max_diff(final, root["reference"]) < TOL, _max_diff(final, root["reference"])
    assert _max_diff(root["reference"], root["init"]) > 1e-2  # training moved the weights ...
    # ... and averaging the passes (half the step) would be far from the reference: the check tells them apart
    assert _max_diff(root["halved"], root["reference"]) > 1e3 * TOL
    assert _max_diff(final, root["halved"]) > 1e3 * TOL


@_needs("torch")
@pytest.mark.parametrize("path", ["grouped", "hooks"])
def test_torch_loop_with_accumulate_2_equals_one_process_on_the_global_batches(torch_ranks, path):
    root = next(r for r in torch_ranks if r["rank"] == 0)
    _check(root[path], root)
    assert _max_diff(torch_ranks[0][path], torch_ranks[1][path]) == 0.0  # every rank holds the same weights


@_needs("tensorflow")
def test_tensorflow_loop_with_accumulate_2_equals_one_plain_keras_process(tensorflow_ranks):
    root = next(r for r in tensorflow_ranks if r["rank"] == 0)
    _check(root["params"], root)
    assert _max_diff(tensorflow_ranks[0]["params"], tensorflow_ranks[1]["params"]) == 0.0
    # One update per 2 backward passes: N / (2 ranks x 8 samples) steps per epoch.
    assert root["updates"] == EPOCHS * N // (2 * accumulation_workers.BATCH)


@_needs("torch")
@_needs("tensorflow")
def test_the_same_loop_ends_on_the_same_weights_in_both_frameworks(torch_ranks, tensorflow_ranks):
    torch_root = next(r for r in torch_ranks if r["rank"] == 0)
    tf_root = next(r for r in tensorflow_ranks if r["rank"] == 0)
    assert all(np.array_equal(a, b) for a, b in zip(torch_root["init"], tf_root["init"]))
    # Different kernels sum in different orders: equal to float32 rounding, far below half a step's difference.
    assert _max_diff(torch_root["grouped"], tf_root["params"]) < 1e-4
    assert _max_diff(torch_root["reference"], tf_root["reference"]) < 1e-4
