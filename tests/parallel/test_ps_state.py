"""A parameter server's optimizer state survives checkpoints and elastic restores (``sync.mode: ps``, PyTorch).

Each owner holds the optimizer state (SGD momentum, Adam's moments and step) of its shard only. One job of 2 real
Horovod workers and one of 1 (tests/parallel/ps_state_workers.py) train hvdsync's MLP on digits, commit after
k = 8 steps (rank 0 writes a durable checkpoint), and resume from it with another random model, at the same
world size, with another number of servers (2 shards -> 1 and 1 -> 2), into plain all-reduce, and with one
worker (2 shards -> 1). Every resumed run must end where the uninterrupted run ends after 2k steps: the same
parameters and the same whole optimizer state.
"""
import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from tests.parallel import ps_state_workers

cloudpickle.register_pickle_by_value(ps_state_workers)
OPTIMIZERS = ps_state_workers.OPTIMIZERS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ps-state")
    two = launch.run(ps_state_workers.same_world, args=(str(root),), np=2, progress=False)
    one = launch.run(ps_state_workers.other_world, args=(str(root),), np=1, progress=False)
    return two, one[0]


def _diff(a, b) -> float:
    """Largest absolute difference over the parameters and every state tensor of two runs."""
    assert sorted(a["state"]) == sorted(b["state"]) and len(a["params"]) == len(b["params"])
    pairs = list(zip(a["params"], b["params"])) + [(a["state"][key], b["state"][key]) for key in a["state"]]
    return max(float(np.max(np.abs(x - y))) for x, y in pairs)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_a_resumed_run_ends_equal_to_the_uninterrupted_one(runs, opt):
    two, _ = runs
    for rank in (0, 1):
        r = two[rank][opt]
        # The whole state: a momentum buffer (SGD) or two moments (Adam) per parameter, gathered from both owners.
        assert len(r["whole"]["state"]) == (1 if opt == "sgd" else 2) * len(r["whole"]["params"])
        assert _diff(r["resumed"], r["whole"]) == 0.0, rank          # same world, same shards: bit for bit
        assert _diff(r["restored"], r["whole"]) == 0.0, rank         # 3 uncommitted steps, restore, go on


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_losing_the_owners_state_would_show(runs, opt):
    # The control: the same resume with every owner's optimizer state zeroed (as before this was saved) ends
    # measurably elsewhere, so the equalities above are not vacuous.
    r = runs[0][0][opt]
    assert _diff(r["zeroed"], r["whole"]) > 1e-3
    assert max(float(np.abs(v).max()) for v in r["whole"]["state"].values()) > 1e-3


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_the_state_is_resharded_for_another_layout(runs, opt):
    two, one = runs
    r = two[0][opt]
    # Two shards -> one server (rank 0 owns everything), one server -> two shards, a PS checkpoint -> plain
    # all-reduce (the whole state is the wrapped optimizer's own format): the same sums in another order.
    assert _diff(r["resumed_one_server"], r["whole"]) < 1e-6
    assert _diff(r["one_server_resumed_sharded"], r["single_whole"]) < 1e-6
    assert _diff(r["resumed_allreduce"], r["whole"]) < 1e-6
    # 2 workers' checkpoint resumed by 1 worker: its one shard is both old shards.
    assert one[opt]["size"] == 1
    assert _diff(one[opt], r["whole"]) < 1e-6


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_a_resumed_all_reduce_run_ends_equal_too(runs, opt):
    # The ranks that load no checkpoint create their optimizer state with a step on zero gradients, which with
    # weight decay moves the parameters; the elastic sync broadcasts the model after it, so nothing of it remains.
    r = runs[0][0][opt]
    assert _diff(r["allreduce_resumed"], r["allreduce_whole"]) == 0.0


def test_every_rank_ends_with_the_same_parameters_and_state(runs):
    two, _ = runs
    for opt in OPTIMIZERS:
        for name in two[0][opt]:
            assert _diff(two[0][opt][name], two[1][opt][name]) == 0.0, (opt, name)
