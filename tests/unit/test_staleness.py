"""Asynchronous SGD with bounded staleness in the core: the delay schedule, which parameter version each gradient
is computed at, tau = 0 being synchronous SGD exactly, and on a real softmax model of digits (numpy) the accuracy
falling with tau and the damping rules recovering it."""
import doctest

import numpy as np
import pytest

from hvdsync.core.train.data import digits
from hvdlab import sim, staleness
from hvdlab.staleness import DAMPING, delays, run_async
from hvdsync.core.train._plan import ShardPlan


def test_docstring_examples():
    assert doctest.testmod(staleness).failed == 0


@pytest.mark.parametrize("kind", ["fixed", "uniform"])
def test_delays_are_bounded_by_tau_and_by_the_versions_that_exist(kind):
    late = delays(500, tau=6, kind=kind, seed=3)
    assert all(0 <= s <= min(6, t) for t, s in enumerate(late))
    if kind == "fixed":
        assert late[6:] == [6] * 494
    else:
        assert set(late[6:]) == set(range(7))                      # every staleness 0..tau occurs


def test_each_gradient_is_computed_at_the_version_s_updates_old_and_applied_to_the_newest():
    # The parameters are a version counter: update t makes version t; grad returns the version it was given.
    seen = []
    run = run_async(0, 40, grad=lambda v, t: seen.append(v) or 0, update=lambda v, g, lr: v + 1, lr=1.0, tau=5,
                    kind="uniform", seed=2)
    assert seen == [t - s for t, s in enumerate(run.staleness)]
    assert run.params == 40


def test_damping_rules():
    assert [DAMPING["none"](s, 8) for s in (0, 8)] == [1.0, 1.0]
    assert [DAMPING["bound"](s, 8) for s in (0, 8)] == [1 / 9, 1 / 9]
    assert [DAMPING["staleness"](s, 8) for s in (0, 3, 8)] == [1.0, 0.25, 1 / 9]
    run = run_async(0.0, 20, lambda x, t: 0.0, lambda x, g, lr: x, lr=0.5, tau=4, damping="staleness",
                    kind="uniform", seed=1)
    assert run.factors == [1 / (1 + s) for s in run.staleness]


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="^damping: 'half' is not allowed"):
        run_async(0.0, 1, lambda x, t: 0.0, lambda x, g, lr: x, 0.1, 1, damping="half")
    with pytest.raises(ValueError, match="^kind: 'poisson' is not allowed"):
        delays(3, 1, kind="poisson")
    with pytest.raises(ValueError, match="^tau: -1 is not allowed"):
        delays(3, -1)


@pytest.fixture(scope="module")
def softmax():
    """Softmax regression on digits, batches of 32 over 3 epochs of the seeded plan."""
    d = digits()
    plan = ShardPlan(len(d.x_train), 1, 32, seed=0)
    batches = [s.indices for e in range(3) for s in plan.epoch(e, 0)]

    def grad(x, t):
        i = batches[t]
        return sim.softmax_grad(x, d.x_train[i], d.y_train[i], d.n_classes, 1 / len(i))

    def train(tau, damping="none", kind="fixed", lr=1.0):
        run = run_async(np.zeros((d.n_features + 1) * d.n_classes), len(batches), grad, lambda x, g, lr: x - lr * g,
                        lr, tau, damping, kind, copy=np.copy)
        return run.params, sim.accuracy(run.params, d.x_test, d.y_test, d.n_classes)

    return grad, batches, train


def test_tau_zero_is_synchronous_sgd_over_the_same_batches(softmax):
    grad, batches, train = softmax
    x = np.zeros_like(train(0)[0])
    for t in range(len(batches)):
        x = x - 1.0 * grad(x, t)
    for damping in DAMPING:
        assert np.array_equal(train(0, damping)[0], x)            # bit for bit: every gradient fresh, factor 1


def test_accuracy_falls_with_staleness_and_damping_recovers_it(softmax):
    _, _, train = softmax
    acc = {tau: train(tau)[1] for tau in (0, 4, 8, 16)}
    assert acc[0] > 0.9
    assert acc[0] > acc[4] > acc[8] > acc[16]                     # measured 0.927, 0.833, 0.693, 0.301
    assert acc[16] < acc[0] - 0.3
    for damping in ("bound", "staleness"):
        damped = train(16, damping)[1]                              # measured 0.837 and 0.878
        assert damped > acc[16] + 0.3, damping
