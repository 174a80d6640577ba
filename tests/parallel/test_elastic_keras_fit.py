"""Elastic Keras ``fit`` of the user's own model (``hvdsync.tensorflow.keras_fit`` + ``ElasticStateCallback``) on a
real elastic job: 2 local hosts, the second one's worker SIGKILLs itself before step 7 (tests/parallel/
elastic_keras_fit_workers.py), the survivor restores the commit of step 6 and fits on alone."""
import cloudpickle
import pytest

from hvdlab import faults
from hvdsync.launch import elastic as elastic_launch
from hvdsync.core.train._plan import ShardPlan
from tests.parallel import elastic_workers, elastic_keras_fit_workers

cloudpickle.register_pickle_by_value(elastic_keras_fit_workers)
HOSTS = elastic_workers.HOSTS
pytestmark = pytest.mark.skipif(len(HOSTS) < 2, reason="needs 2 local host names")


@pytest.fixture(scope="module")
def lost_worker(tmp_path_factory):
    cfg = elastic_workers.config("tensorflow")   # 2 epochs of digits, batch 16 per rank, commit every 2 steps
    with faults.armed(f"kill@6:{HOSTS[1]}"):
        return elastic_launch.run_elastic(elastic_keras_fit_workers.keras_fit, (cfg.to_dict(),), cfg.elastic, 2,
                                          tmp_path_factory.mktemp("keras-fit"), hosts=HOSTS[:2], progress=False)[0]


def test_fit_resumes_at_the_committed_epoch_and_sample_on_the_new_world(lost_worker):
    lost = lost_worker["resets"][0]
    assert lost["reason"] == "worker lost" and (lost["size_before"], lost["size_after"]) == (2, 1)
    assert lost["step"] == 7                                   # the first step after the commit of step 6
    # fit entered twice: at the start, then at epoch 0 after 6 steps of 2 x 16 samples, with 1 worker.
    assert lost_worker["entries"] == [[0, 0, 2], [0, 6 * 32, 1]]


def test_every_step_of_both_epochs_is_trained_once(lost_worker):
    # 6 steps on 2 workers, then the rest of epoch 0 and all of epoch 1 on 1 worker (16 samples a step): a fit
    # that stopped epoch 1 after as many batches as the short resumed epoch had would be 11 steps short.
    alone = ShardPlan(1348, 1, 16)
    assert lost_worker["steps"] == 6 + alone.steps_per_epoch(6 * 32) + alone.steps_per_epoch() == 164
    assert lost_worker["epoch"] == 2 and lost_worker["size"] == 1
    assert lost_worker["accuracy"] >= 0.85


def test_the_committed_state_holds_every_optimizer_variable_once(lost_worker):
    # The gradient sums, the pass counter and the wrapped optimizer's variables (momentum): each listed exactly once
    # (an earlier version looked for a stale attribute name and listed the pass counter twice).
    assert lost_worker["times_listed"] == [1] * len(lost_worker["times_listed"])
    # 4 gradient sums (2 Dense layers), the pass counter, SGD's iterations, learning rate and 4 momentum slots.
    assert len(lost_worker["times_listed"]) == 4 + 1 + 2 + 4
    assert lost_worker["distinct_listed"] == lost_worker["listed"]   # and nothing else listed twice either
