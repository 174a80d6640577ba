"""The loss scale makes any split of a global step (ranks x micro-batches, uneven) give the full-batch mean gradient."""
import numpy as np
import pytest

from hvdsync.core.train._scaling import loss_scale, scaled_lr
from hvdsync.core.train._plan import ShardPlan


def _grad_sum(w, x, y):
    # Gradient of the *summed* squared error of a linear model: sum_i (x_i.w - y_i) x_i
    return ((x @ w - y)[:, None] * x).sum(axis=0)


@pytest.mark.parametrize("world,batch,accumulate,n", [(2, 8, 1, 64), (3, 8, 4, 101), (4, 5, 3, 23), (2, 16, 16, 33)])
@pytest.mark.parametrize("op", ["average", "sum"])
def test_combined_gradient_equals_full_batch_mean(world, batch, accumulate, n, op):
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(n, 5)), rng.normal(size=n), rng.normal(size=5)
    plan = ShardPlan(n, world, batch, accumulate, seed=1)
    for s in range(plan.steps_per_epoch()):
        steps = [plan.epoch(0, r)[s] for r in range(world)]
        scale = loss_scale(steps[0].global_count, world, op)
        # each rank accumulates its micro-batch gradients of (scale * summed loss) ...
        local = [sum(scale * _grad_sum(w, x[m], y[m]) for m in st.micro) for st in steps]
        # ... then Horovod combines them with the op
        combined = sum(local) / (world if op == "average" else 1)
        idx = np.concatenate([st.indices for st in steps])
        expected = _grad_sum(w, x[idx], y[idx]) / len(idx)
        np.testing.assert_allclose(combined, expected, rtol=1e-12, atol=1e-12)


def test_dividing_by_micro_batch_size_is_the_bug_it_prevents():
    # Per-micro-batch means summed over k micro-batches weigh the step k times too much.
    rng = np.random.default_rng(1)
    x, y, w = rng.normal(size=(32, 3)), rng.normal(size=32), rng.normal(size=3)
    micro = np.array_split(np.arange(32), 4)
    wrong = sum(_grad_sum(w, x[m], y[m]) / len(m) for m in micro)
    right = sum(loss_scale(32, 1, "sum") * _grad_sum(w, x[m], y[m]) for m in micro)
    np.testing.assert_allclose(wrong, 4 * right)


def test_scale_rejects_bad_values():
    with pytest.raises(ValueError, match="global_count"):
        loss_scale(0, 2, "average")
    with pytest.raises(ValueError, match="op: 'max'"):
        loss_scale(4, 2, "max")
    assert scaled_lr(0.1, 4, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 4, "none") == 0.1
