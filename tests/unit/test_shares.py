"""Unequal shares of a global step and a growing batch keep the plan's promises: every sample once per epoch, the
same steps and micro-batches on every rank, rank weights summing to one, the combined gradient the global mean."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdsync.config import Config, ConfigError
from hvdsync.core.train._scaling import grown_lr, loss_scale
from hvdsync.core.train.shares import balanced_shares, local_weights, share_slice, split_counts
from hvdsync.core.train._plan import ShardPlan


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
    # A simulated straggler is no config field: a test passes one in (hvdlab.straggler.SlowRank).
    ({"test_slow_rank": 1}, "data.test_slow_rank: unknown field"),
    ({"test_slowdown": 2.0}, "data.test_slowdown: unknown field"),
])
def test_bad_share_and_growth_values_fail_in_the_config(data, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        Config.from_dict({"data": data})


def test_bad_growth_rule_and_elastic_combination_fail_in_the_config():
    with pytest.raises(ConfigError, match="^train.growth_lr: 'cube' is not allowed; choose one of: none, linear, sqrt"):
        Config.from_dict({"train": {"growth_lr": "cube"}})
    with pytest.raises(ConfigError, match="^data.shares: 'adaptive' is not allowed with elastic training"):
        Config.from_dict({"data": {"shares": "adaptive"}, "elastic": {"enabled": True}})


def _slow_rank(factor, rank=0, size=2):
    """A :class:`hvdlab.straggler.SlowRank` for ``rank``, told at train begin that this process is rank 0."""
    from types import SimpleNamespace

    from hvdlab.straggler import SlowRank

    timer = SlowRank(rank, factor)
    timer.on_train_begin(SimpleNamespace(rank=0, size=size))
    return timer


def test_the_straggler_is_checked_against_the_world_it_is_passed_into():
    from types import SimpleNamespace

    from hvdlab.straggler import SlowRank

    with pytest.raises(ValueError, match="^" + re.escape("rank: 2 is not allowed in a world of 2 ranks")):
        SlowRank(2, 2.0).on_train_begin(SimpleNamespace(rank=0, size=2))
    with pytest.raises(ValueError, match="^" + re.escape("factor: 0.5 is not allowed; expected a number >= 1.0")):
        SlowRank(1, 0.5)
    with pytest.raises(ValueError, match="^" + re.escape("rank: -1 is not allowed; expected an integer >= 0")):
        SlowRank(-1, 2.0)


def test_the_test_slowdown_is_busy_before_the_work_in_proportion_to_its_samples():
    # Lower bounds only: a busy wait lasts at least until its deadline, whatever the machine's load.
    import time

    timer = _slow_rank(3.0)
    assert not timer.fuse_phases                  # nothing measured yet: each phase is a call of its own
    with timer.phase("compute", samples=100):  # nothing measured yet: busy *after* it, 2x its own time
        time.sleep(0.01)                          # >= 1e-4 s per sample
    assert timer.seconds["compute"] >= 3 * 0.01
    before = time.perf_counter()
    with timer.phase("compute", samples=200):
        entered = time.perf_counter()             # the busy wait came first: before any gradient could leave
        time.sleep(0.01)
    assert entered - before >= 2 * 1e-4 * 200     # (slowdown - 1) x seconds per sample x samples
    assert timer.fuse_phases                      # measured: busy before the work, also in a one-graph step


def test_the_test_slowdown_counts_its_busy_time_in_a_phase_timed_by_another_clock():
    # TensorFlow's one-graph step times its compute phase by the graph's clock (span.seconds): the busy wait
    # before it is part of the phase all the same, and the cost per sample is learnt from the graph's seconds.
    import time

    timer = _slow_rank(3.0)
    with timer.phase("compute", samples=100):
        time.sleep(0.01)
    compute, start = timer.seconds["compute"], time.perf_counter()
    with timer.phase("compute", samples=100) as span:
        entered = time.perf_counter()
        time.sleep(0.05)                          # the graph also all-reduced and updated ...
        span.seconds = 0.01                       # ... its compute took this long
    busy = timer.seconds["compute"] - compute - 0.01
    assert busy >= 2 * 1e-4 * 100                 # busy before it, counted in the phase ...
    assert busy <= entered - start                # ... and nothing of the call after the compute
    assert timer.counts["compute"] == 2


def test_the_slow_rank_slows_only_its_own_rank():
    import time

    waits = {}
    for rank in (0, 1):                           # this process is rank 0
        timer = _slow_rank(3.0, rank=rank)
        calls = waits[rank] = []

        def busy(seconds, calls=calls):           # counts the busy waits instead of waiting
            calls.append(seconds)
            return seconds

        timer.busy = busy
        for _ in range(2):
            with timer.phase("compute", samples=100):
                time.sleep(0.001)
            with timer.phase("sync_wait"):        # only compute phases are slowed
                time.sleep(0.001)
        timer.on_evaluate_begin(None)
        time.sleep(0.001)                         # the scoring
        timer.on_evaluate_end(None)
        assert timer.counts == {"compute": 2, "sync_wait": 2}
    assert len(waits[0]) == 3 and all(w > 0 for w in waits[0])   # after the first phase, before the second, scoring
    assert waits[1] == []                                        # another rank's timer times only


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
    from hvdlab.straggler import SlowRank

    timer = SlowRank(0, 3.0)
    assert timer.slow_after(0.02) == 0.0                 # not slowed (before training begins): returns at once
    timer = _slow_rank(3.0)
    assert timer.slow_after(0.02) >= 2 * 0.02             # busy (factor - 1) x the work's seconds, at least
    assert timer.slow_after(0.0) == 0.0


def test_the_slowed_rank_scores_slower_inside_the_loops_evaluation_time():
    # The loop's evaluation hooks run inside its timed eval_seconds, whichever evaluator runs.
    import time

    from hvdsync.core.train.data import digits
    from hvdsync.fitting import fit_loop
    from tests.unit.test_loop import NumpyBackend

    cfg = Config.from_dict({"data": {"batch_size": 500}, "train": {"epochs": 1, "np": 1},
                            "tracking": {"enabled": False}, "monitor": {"every": 0}})

    def evaluate():
        time.sleep(0.02)
        return {"test_accuracy": (1.0, 1.0)}

    results = {}
    for factor in (1.0, 3.0):
        backend = NumpyBackend(64, 10)
        slow = _slow_rank(factor, size=1)
        backend.timer = slow
        results[factor] = fit_loop(cfg, backend, digits(seed=0), evaluate, callbacks=[slow], observe=False)
    assert results[3.0].history[0]["eval_seconds"] >= 3 * 0.02        # busy (factor - 1) x the evaluation, after it
    assert results[1.0].history[0]["eval_seconds"] < 3 * 0.02


def test_the_throughput_pools_only_epochs_that_ran_with_about_the_same_shares():
    from hvdsync.core.train.adaptive import window_rate

    equal, adapted, settled = ((0.5, 0.5), [10.0, 10.0, 10.0]), ((0.7, 0.3), [8.0, 8.0]), ((0.72, 0.28), [7.0, 7.0])
    assert window_rate([equal, adapted]) == 8.0                    # the equal epoch measured another balance
    assert window_rate([equal, adapted, settled]) == 7.5            # 0.02 apart: pooled, the median of four steps
    assert window_rate([equal, adapted, settled], tolerance=1.0) == 8.0   # everything pooled, as before
    assert window_rate([((0.5, 0.5), [])]) == 0.0                  # nothing measured
