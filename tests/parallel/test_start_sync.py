"""hvdsync's distributed optimizer never lets replicas start apart (issue 54): on 2 real Horovod workers whose
models start from *different* weights, training without any broadcast ends with equal weights on both ranks, equal
to a run with the explicit broadcast (torch: ``broadcast_state`` before training; Keras 3 ``compile``/``fit`` with
the ``PlanSampler`` callback: the broadcast callback), with one broadcast of the weights either way. The control
sets the flag without broadcasting: the ranks end apart, so it is the broadcast that makes them equal.
"""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from tests.parallel import start_sync_workers

cloudpickle.register_pickle_by_value(start_sync_workers)


def _apart(a: list, b: list) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def torch_ranks():
    return launch.run(start_sync_workers.torch_runs, np=2, progress=False)


@pytest.fixture(scope="module")
def keras_ranks():
    return launch.run(start_sync_workers.keras_runs, np=2, progress=False)


def test_torch_ranks_that_start_apart_end_equal_and_equal_to_an_explicit_broadcast(torch_ranks):
    zero, one = torch_ranks
    assert _apart(zero["implicit"]["start"], one["implicit"]["start"]) > 0.01   # they did start apart
    for how in ("implicit", "explicit", "no model"):
        assert _apart(zero[how]["end"], one[how]["end"]) == 0.0, how
        assert zero[how]["broadcasts"] == one[how]["broadcasts"] == 1, how        # once, not again after explicit
    # The broadcast ran before the first training forward: the same numbers as broadcasting before training.
    assert _apart(zero["implicit"]["end"], zero["explicit"]["end"]) == 0.0
    assert zero["flag only"]["broadcasts"] == 0 and _apart(zero["flag only"]["end"], one["flag only"]["end"]) > 0.01


def test_keras_fit_ranks_that_start_apart_end_equal_and_equal_to_an_explicit_broadcast(keras_ranks):
    zero, one = keras_ranks
    assert _apart(zero["implicit"]["start"], one["implicit"]["start"]) > 0.01   # they did start apart
    for how in ("implicit", "callback"):
        assert _apart(zero[how]["end"], one[how]["end"]) == 0.0, how
    # The optimizer broadcast while fit traced the first step, so before it ran: the numbers of the callback's
    # broadcast before training.
    assert _apart(zero["implicit"]["end"], zero["callback"]["end"]) == 0.0
    assert _apart(zero["flag only"]["end"], one["flag only"]["end"]) > 0.01
    # Once: a rank moved away after training is not pulled back by the optimizer in the next fit.
    assert _apart(zero["implicit"]["later"], one["implicit"]["later"]) > 0.5
