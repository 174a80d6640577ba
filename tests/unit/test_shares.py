"""Unequal shares of a global step and a growing batch keep the plan's promises: every sample once per epoch, the
same steps and micro-batches on every rank, rank weights summing to one, the combined gradient the global mean."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdsync.config import Config, ConfigError
from hvdsync.core.train.scaling import grown_lr, loss_scale
from hvdsync.core.train.shares import balanced_shares, local_weights, share_slice, split_counts
from hvdsync.core.train.sharding import ShardPlan


@st.composite
def unequal_plans(draw):
    world = draw(st.integers(1, 6))
    shares = draw(st.lists(st.floats(0.0, 1.0), min_size=world, max_size=world).filter(lambda s: sum(s) > 1e-3))
    growth = draw(st.dictionaries(st.integers(1, 6), st.integers(1, 4), max_size=3))
    growth = dict(zip(sorted(growth), sorted(growth.values())))  # factors never shrink
    return ShardPlan(draw(st.integers(1, 500)), world, draw(st.integers(1, 40)), draw(st.integers(1, 4)),
                     draw(st.integers(0, 2**32 - 1)), draw(st.booleans()), shares=tuple(shares), growth=growth)


@settings(max_examples=300, deadline=None)
@given(plan=unequal_plans(), epoch=st.integers(0, 8))
def test_unequal_shares_read_every_sample_once_in_equal_steps(plan, epoch):
    per_rank = [plan.epoch(epoch, r) for r in range(plan.world_size)]
    read = np.concatenate([s.indices for steps in per_rank for s in steps])
    assert np.array_equal(np.sort(read), np.arange(plan.dataset_size))                 # exactly once
    assert {len(steps) for steps in per_rank} == {plan.steps_per_epoch(0, epoch)}       # same steps ...
    assert all(len(s.micro) == plan.accumulate for steps in per_rank for s in steps)   # ... and micro-batches
    for s in range(plan.steps_per_epoch(0, epoch)):
        step = [per_rank[r][s] for r in range(plan.world_size)]
        assert sum(x.local_count for x in step) == step[0].global_count
        assert local_weights(step).sum() == pytest.approx(1.0, abs=1e-12)               # weights sum to one
        # each rank's piece is within one sample of its share of the step
        exact = np.asarray(plan.shares) * step[0].global_count
        assert np.all(np.abs([x.local_count for x in step] - exact) < 1.0 + 1e-9)


@settings(max_examples=150, deadline=None)
@given(plan=unequal_plans(), epoch=st.integers(0, 8), data=st.data())
def test_changing_shares_mid_epoch_neither_repeats_nor_skips(plan, epoch, data):
    steps_done = data.draw(st.integers(0, plan.steps_per_epoch(0, epoch)))
    before = [s.indices for r in range(plan.world_size) for s in plan.epoch(epoch, r)[:steps_done]]
    consumed = min(plan.dataset_size, steps_done * plan.global_batch_at(epoch))
    other = plan.with_shares(data.draw(st.lists(st.floats(0.01, 1.0), min_size=plan.world_size,
                                                max_size=plan.world_size)))
    after = [s.indices for r in range(plan.world_size) for s in other.epoch(epoch, r, start=consumed)]
    read = np.concatenate(before + after) if before + after else np.empty(0, int)
    assert np.array_equal(np.sort(read), np.arange(plan.dataset_size))


@pytest.mark.parametrize("shares,accumulate", [((0.7, 0.3), 1), ((0.5, 0.2, 0.3), 3), ((1.0, 0.0), 2)])
@pytest.mark.parametrize("op", ["average", "sum"])
def test_unequal_shares_give_the_global_mean_gradient(shares, accumulate, op):
    # Linear least squares; each rank sums scale x its per-sample gradients, Horovod combines with the op.
    rng = np.random.default_rng(0)
    n, world = 103, len(shares)
    x, y, w = rng.normal(size=(n, 4)), rng.normal(size=n), rng.normal(size=4)
    plan = ShardPlan(n, world, 8, accumulate, seed=3, shares=shares)
    for s in range(plan.steps_per_epoch()):
        steps = [plan.epoch(0, r)[s] for r in range(world)]
        scale = loss_scale(steps[0].global_count, world, op)
        local = [sum(scale * (((x[m] @ w - y[m])[:, None]) * x[m]).sum(0) for m in st_.micro) for st_ in steps]
        combined = sum(local) / (world if op == "average" else 1)
        idx = np.concatenate([st_.indices for st_ in steps])
        expected = (((x[idx] @ w - y[idx])[:, None]) * x[idx]).mean(0)
        np.testing.assert_allclose(combined, expected, rtol=1e-12, atol=1e-12)


def test_split_counts_and_balanced_shares():
    assert split_counts(64, (0.5, 0.5)).tolist() == [32, 32]
    assert split_counts(5, (0.5, 0.5)).tolist() == [len(a) for a in np.array_split(np.arange(5), 2)]
    assert split_counts(30, (0.1, 0.9)).tolist() == [3, 27]
    # equal shares given explicitly cut exactly like the default plan
    explicit, default = ShardPlan(101, 3, 8, 2, shares=(1, 1, 1)), ShardPlan(101, 3, 8, 2)
    assert all(np.array_equal(a.indices, b.indices) for r in range(3)
               for a, b in zip(explicit.epoch(1, r), default.epoch(1, r)))
    assert balanced_shares([100, 100], [1.0, 2.0]) == pytest.approx((2 / 3, 1 / 3))
    assert balanced_shares([100, 100], [1.0, 1000.0])[1] == pytest.approx(0.1)        # floor: 0.2 of equal
    assert balanced_shares([100, 0], [1.0, 0.0], previous=(0.6, 0.4)) == pytest.approx((0.6, 0.4))
    assert sum(balanced_shares([10, 20, 30], [1.0, 3.0, 2.0])) == pytest.approx(1.0)


def test_growth_cuts_epochs_into_fewer_larger_steps():
    plan = ShardPlan(1000, 2, 10, growth={2: 2, 4: 4})
    assert [plan.steps_per_epoch(0, e) for e in range(6)] == [50, 50, 25, 25, 13, 13]
    assert [plan.batch_size_at(e) for e in (0, 2, 5)] == [10, 20, 40]
    assert [grown_lr(0.1, f, "sqrt") for f in (1, 4)] == pytest.approx([0.1, 0.2])


@pytest.mark.parametrize("data,message", [
    ({"shares": "fastest"}, "data.shares: 'fastest' is not allowed; choose one of: equal, adaptive"),
    ({"batch_growth": {0: 2}}, "data.batch_growth: {0: 2} is not allowed; each epoch must be an integer >= 1"),
    ({"batch_growth": {2: 4, 3: 2}}, "data.batch_growth: {2: 4, 3: 2} is not allowed; the batch factor must not "
                                     "shrink"),
    ({"batch_growth": {2: 0.5}}, "data.batch_growth: {2: 0.5} is not allowed; each factor must be an integer"),
    ({"batch_growth": "2:2"}, "data.batch_growth: '2:2' is not allowed; expected a mapping of epoch to batch"),
    ({"test_slow_rank": 2}, "data.test_slow_rank: 2 is not allowed with train.np 2"),
    ({"test_slowdown": 0.5}, "data.test_slowdown: 0.5 is not allowed; expected a number >= 1.0"),
])
def test_bad_share_and_growth_values_fail_in_the_config(data, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        Config.from_dict({"data": data})


def test_bad_growth_rule_and_elastic_combination_fail_in_the_config():
    with pytest.raises(ConfigError, match="^train.growth_lr: 'cube' is not allowed; choose one of: none, linear, sqrt"):
        Config.from_dict({"train": {"growth_lr": "cube"}})
    with pytest.raises(ConfigError, match="^data.shares: 'adaptive' is not allowed with elastic training"):
        Config.from_dict({"data": {"shares": "adaptive"}, "elastic": {"enabled": True}})


def test_the_test_slowdown_is_busy_before_the_work_in_proportion_to_its_samples():
    # Lower bounds only: a busy wait lasts at least until its deadline, whatever the machine's load.
    import time

    from hvdsync.core.telemetry.profiling import PhaseTimer

    timer = PhaseTimer()
    timer.slow_down(3.0)
    with timer.phase("compute", samples=100):  # nothing measured yet: busy *after* it, 2x its own time
        time.sleep(0.01)                          # >= 1e-4 s per sample
    assert timer.seconds["compute"] >= 3 * 0.01
    before = time.perf_counter()
    with timer.phase("compute", samples=200):
        entered = time.perf_counter()             # the busy wait came first: before any gradient could leave
        time.sleep(0.01)
    assert entered - before >= 2 * 1e-4 * 200     # (slowdown - 1) x seconds per sample x samples


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 2000), shares=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6)
       .filter(lambda s: sum(s) > 1e-3))
def test_share_slices_cut_a_test_set_into_contiguous_parts_read_once(total, shares):
    world = len(shares)
    parts = [share_slice(total, r, world, shares) for r in range(world)]
    assert [p.stop - p.start for p in parts] == split_counts(total, np.asarray(shares) / sum(shares)).tolist()
    assert np.array_equal(np.concatenate([np.arange(total)[p] for p in parts]), np.arange(total))  # in order, once
    equal = [share_slice(total, r, world) for r in range(world)]                  # None: the equal cut
    assert [p.stop - p.start for p in equal] == [len(a) for a in np.array_split(np.arange(total), world)]


def test_the_test_slowdown_slows_work_outside_the_phases_by_its_factor():
    from hvdsync.core.telemetry.profiling import PhaseTimer

    timer = PhaseTimer()
    assert timer.slow_after(0.02) == 0.0                 # not slowed: returns at once
    timer.slow_down(3.0)
    assert timer.slow_after(0.02) >= 2 * 0.02             # busy (factor - 1) x the work's seconds, at least
    assert timer.slow_after(0.0) == 0.0


def test_the_throughput_pools_only_epochs_that_ran_with_about_the_same_shares():
    from hvdsync.core.train.adaptive import window_rate

    equal, adapted, settled = ((0.5, 0.5), [10.0, 10.0, 10.0]), ((0.7, 0.3), [8.0, 8.0]), ((0.72, 0.28), [7.0, 7.0])
    assert window_rate([equal, adapted]) == 8.0                    # the equal epoch measured another balance
    assert window_rate([equal, adapted, settled]) == 7.5            # 0.02 apart: pooled, the median of four steps
    assert window_rate([equal, adapted, settled], tolerance=1.0) == 8.0   # everything pooled, as before
    assert window_rate([((0.5, 0.5), [])]) == 0.0                  # nothing measured
