"""The global data plan: every index read exactly once per epoch, same step counts on every rank, reproducible."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdlab.sharding import naive_shards
from hvdsync.core.train._plan import ShardPlan

plans = st.builds(
    ShardPlan,
    dataset_size=st.integers(1, 700),
    world_size=st.integers(1, 9),
    batch_size=st.integers(1, 40),
    accumulate=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
    shuffle=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(plan=plans, epoch=st.integers(0, 50))
def test_every_index_read_exactly_once_per_epoch(plan, epoch):
    read = np.concatenate([plan.rank_indices(epoch, r) for r in range(plan.world_size)])
    assert len(read) == plan.dataset_size
    assert np.array_equal(np.sort(read), np.arange(plan.dataset_size))


@settings(max_examples=300, deadline=None)
@given(plan=plans, epoch=st.integers(0, 50))
def test_all_ranks_run_the_same_steps_and_micro_steps(plan, epoch):
    # Equal counts on every rank are what keep collectives from deadlocking on uneven data.
    per_rank = [plan.epoch(epoch, r) for r in range(plan.world_size)]
    assert {len(steps) for steps in per_rank} == {plan.steps_per_epoch()}
    for s in range(plan.steps_per_epoch()):
        sizes = [per_rank[r][s].local_count for r in range(plan.world_size)]
        assert max(sizes) - min(sizes) <= 1                      # as even as possible
        assert sum(sizes) == per_rank[0][s].global_count          # the loss-scale denominator is right
        assert all(len(per_rank[r][s].micro) == plan.accumulate for r in range(plan.world_size))


@settings(max_examples=200, deadline=None)
@given(plan=plans, epoch=st.integers(0, 50))
def test_global_order_does_not_depend_on_world_size(plan, epoch):
    # Step s of a W-rank run reads the same samples as step s of a 1-rank run with a W-times bigger batch:
    # what makes "2 workers x B == 1 worker x 2B" possible.
    single = ShardPlan(plan.dataset_size, 1, plan.global_batch, 1, plan.seed, plan.shuffle)
    per_rank = [plan.epoch(epoch, r) for r in range(plan.world_size)]
    for s, ref in enumerate(single.epoch(epoch, 0)):
        together = np.concatenate([per_rank[r][s].indices for r in range(plan.world_size)])
        assert np.array_equal(together, ref.indices)


@settings(max_examples=100, deadline=None)
@given(plan=plans, epoch=st.integers(0, 50), new_world=st.integers(1, 9), data=st.data())
def test_resizing_mid_epoch_neither_repeats_nor_skips(plan, epoch, new_world, data):
    steps_done = data.draw(st.integers(0, plan.steps_per_epoch()))
    before = [np.concatenate([s.indices for s in plan.epoch(epoch, r)[:steps_done]] or [np.empty(0, int)])
              for r in range(plan.world_size)]
    consumed = min(plan.dataset_size, steps_done * plan.global_batch)
    after_plan = plan.resized(new_world)
    after = [after_plan.rank_indices(epoch, r, start=consumed) for r in range(new_world)]
    read = np.concatenate(before + after)
    assert np.array_equal(np.sort(read), np.arange(plan.dataset_size))


def test_seeds_make_it_reproducible_and_epochs_differ():
    a = ShardPlan(1000, 4, 16, seed=7)
    b = ShardPlan(1000, 4, 16, seed=7)
    c = ShardPlan(1000, 4, 16, seed=8)
    assert np.array_equal(a.rank_indices(3, 2), b.rank_indices(3, 2))
    assert not np.array_equal(a.rank_indices(3, 2), c.rank_indices(3, 2))
    assert not np.array_equal(a.order(0), a.order(1))


def test_naive_per_rank_shuffling_duplicates_and_misses_samples():
    # The failure the plan prevents: each rank shuffles with its own seed and takes a strided shard.
    read = np.concatenate([naive_shards(1000, 4, r, seed=r) for r in range(4)])
    assert len(np.unique(read)) < 1000            # some samples never read ...
    assert len(read) - len(np.unique(read)) > 0   # ... and others read twice


@pytest.mark.parametrize("field,value", [("dataset_size", 0), ("world_size", 0), ("batch_size", -1),
                                         ("accumulate", 0)])
def test_bad_plan_values_are_named(field, value):
    kwargs = dict(dataset_size=10, world_size=2, batch_size=2, accumulate=1)
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"ShardPlan.{field}"):
        ShardPlan(**kwargs)
