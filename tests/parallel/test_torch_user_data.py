"""Your own model, loss and Dataset with hvdsync.torch on real Horovod workers (2 processes, Gloo).

One pair of workers runs every check (tests/parallel/torch_user_data_workers.py) and returns the numbers; each test
asserts one promise. (Horovod's knobs in a plain `horovodrun` script: tests/parallel/test_torch.py.)
"""
import cloudpickle
import pytest

from hvdsync import launch
from tests.parallel import torch_user_data_workers

cloudpickle.register_pickle_by_value(torch_user_data_workers)


@pytest.fixture(scope="module")
def checks():
    results = launch.run(torch_user_data_workers.run_checks, np=2, progress=False)
    assert len(results) == 2
    return results


def test_dataloader_with_plan_sampler_reads_every_sample_exactly_once_per_epoch(checks):
    r = checks[0]
    assert r["reads_per_epoch"] == [[1] * 301, [1] * 301]   # counted over both ranks, DataLoader num_workers=2
    assert r["steps_out_of_plan_order_each_rank"] == [0, 0]   # each step's micro-batches came out in plan order
    assert r["steps_per_epoch_each_rank"] == [10, 10]     # the same number of steps on both ranks
    assert r["last_step_scale"] == pytest.approx(2 / 13)  # short last step: 13 samples, average over 2 ranks


def test_two_workers_through_the_dataloader_equal_one_process_with_the_big_batch(checks):
    r = checks[0]
    assert r["big_batch_moved"] > 1e-2
    assert r["big_batch_max_diff"] < 1e-5
    assert r["rounds_for_steps"][0] == r["rounds_for_steps"][1] == 10   # one all-reduce per step, 2 micro-batches


def test_a_state_taken_mid_epoch_continues_with_exactly_the_unread_samples(checks):
    r = checks[0]
    assert r["state"] == {"epoch": 3, "consumed": 4 * 32}
    assert r["same_world_reads"] == [1] * 301
    assert r["resized_reads"] == [1] * 301                                 # also in a world of 3,
    assert r["read_after_resize"] == r["unread_at_state"]                  # which read just what was left


def test_fit_trains_a_user_cnn_with_label_smoothing_on_a_user_dataset(checks):
    fit = checks[0]["fit"]
    assert fit["test_accuracy"] >= 0.95                  # digits as 8x8 images, 4 epochs (0.976 measured)
    assert fit["param_spread"] == 0.0
    assert fit["optimizer_steps"] == fit["allreduce_rounds"] == checks[0]["fit_steps_expected"]
    assert fit["plan_state"] == {"epoch": 4, "consumed": 0}
    assert checks[0]["fit_history"] == checks[1]["fit_history"]


def test_bad_input_fails_with_one_clear_message_before_training(checks):
    for r in checks:
        e = r["errors"]
        assert e["model_differs"].startswith("model: the parameters differ between ranks (rank 0: 6 tensors")
        assert e["rank_outside"] == ("rank: 2 is not allowed; expected 0 <= rank < 2 (the world has 2 ranks)")
        assert e["no_loss"].startswith("loss: fit(model=...) with your own model needs loss=...")

