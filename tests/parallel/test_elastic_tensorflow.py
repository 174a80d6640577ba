"""Elastic TensorFlow (Keras 3) on real Horovod workers: hvdsync's own state, because Horovod's fails on Keras 3.

The same jobs as the PyTorch tests (tests/parallel/elastic_workers.py): a worker SIGKILLed mid-epoch and a host added
(the joining worker must receive every Keras variable from rank 0, which Horovod's TF2 state never broadcasts),
and a lost job resumed from a damaged checkpoint directory.
"""
import numpy as np
import pytest

from tests.parallel import elastic_workers

pytestmark = pytest.mark.skipif(len(elastic_workers.HOSTS) < 3, reason="needs 3 local host names")


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    return elastic_workers.shrink_and_grow("tensorflow", tmp_path_factory.mktemp("tf-grow"))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    return elastic_workers.kill_and_resume("tensorflow", tmp_path_factory.mktemp("tf-resume"))


def test_a_killed_worker_is_a_reset_not_a_dead_job(grown):
    lost = grown.resets[0]
    assert lost["reason"] == "worker lost" and (lost["size_before"], lost["size_after"]) == (2, 1)
    assert lost["step"] == 7                       # continued from the commit at step 6


def test_a_joining_worker_gets_rank_0s_variables(grown):
    assert grown.resets[1]["reason"] == "hosts added" and grown.world_size == 2
    assert grown.param_spread == 0.0               # with Horovod's TensorFlowState the newcomer would keep its own
    assert grown.test_accuracy >= 0.85


def test_every_sample_exactly_once(grown):
    reads = np.array(grown.reads)
    assert reads.shape == (2, 1348) and reads.min() == 1 and reads.max() == 1


def test_resumed_run_matches_the_uninterrupted_one(resumed):
    whole, again, reports, steps, payload = resumed
    assert again.steps == whole.steps and steps[-1] < whole.steps
    # Bitwise: TensorFlow on CPU with op determinism (train.deterministic) and the same world size at every step
    # gives the same floating-point operations in the same order, and the checkpoint holds every variable exactly.
    assert again.params_sha256 == whole.params_sha256
    assert f"checkpoint skipped: {payload}: checksum mismatch" in reports
    assert f"(step {steps[-2]})" in reports
