"""Your own model, loss and Dataset with hvdsync.torch on real Horovod workers (2 processes, Gloo).

One pair of workers runs every check (tests/parallel/torch_user_checks.py) and returns the numbers; each test
asserts one promise. One more launch runs the plain `horovodrun` example and reads Horovod's knobs back.
"""
import json
import os
import pathlib
import subprocess
import sys

import cloudpickle
import pytest

from hvdsync import launch
from tests.parallel import torch_user_checks

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
cloudpickle.register_pickle_by_value(torch_user_checks)


@pytest.fixture(scope="module")
def checks():
    results = launch.run(torch_user_checks.run_checks, np=2, progress=False)
    assert len(results) == 2
    return results


def test_dataloader_with_plan_sampler_reads_every_sample_exactly_once_per_epoch(checks):
    r = checks[0]
    assert r["reads_per_epoch"] == [[1] * 301, [1] * 301]   # counted over both ranks, DataLoader num_workers=2
    assert r["micro_in_order"]                            # each step's micro-batches came out in plan order
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
    assert r["resized_reads"] == [1] * 301 and r["resized_plan_unread"]   # also in a world of 3


def test_fit_trains_a_user_cnn_with_label_smoothing_on_a_user_dataset(checks):
    fit = checks[0]["fit"]
    assert fit["test_accuracy"] >= 0.90                  # digits as 8x8 images, 8 epochs
    assert fit["param_spread"] == 0.0
    assert fit["optimizer_steps"] == fit["allreduce_rounds"] == checks[0]["fit_steps_expected"]
    assert fit["plan_state"] == {"epoch": 8, "consumed": 0}
    assert checks[0]["fit_history"] == checks[1]["fit_history"]


def test_bad_input_fails_with_one_clear_message_before_training(checks):
    for r in checks:
        e = r["errors"]
        assert e["model_differs"].startswith("model: the parameters differ between ranks (rank 0: 6 tensors")
        assert e["rank_outside"] == ("rank: 2 is not allowed; expected 0 <= rank < 2 (the world has 2 ranks)")
        assert e["no_loss"].startswith("loss: fit(model=...) with your own model needs loss=...")


def test_plain_horovodrun_script_gets_the_fusion_threshold_it_records(tmp_path):
    """`--set sync.fusion_threshold_mb=8` reaches Horovod in a plain horovodrun script, and MLflow records it."""
    db = tmp_path / "m.db"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    env.pop("HOROVOD_FUSION_THRESHOLD", None)
    # Each worker runs the example unchanged, then prints what its own environment held for Horovod.
    read_back = ("import json, os, runpy, horovod.torch as hvd\n"
                 f"runpy.run_path({str(ROOT / 'examples' / 'train_torch.py')!r}, run_name='__main__')\n"
                 "print('KNOBS', json.dumps({'rank': hvd.rank(),\n"
                 "                           'fusion': os.environ.get('HOROVOD_FUSION_THRESHOLD')}))")
    proc = subprocess.run(
        [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", read_back,
         "--set", "sync.fusion_threshold_mb=8", "--set", "train.epochs=2"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    knobs = [json.loads(line.split("KNOBS", 1)[1]) for line in proc.stdout.splitlines() if "KNOBS" in line]
    assert sorted(k["rank"] for k in knobs) == [0, 1]
    assert all(k["fusion"] == str(8 * 1024 * 1024) for k in knobs)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["sync.fusion_threshold_mb"] == "8"
    assert run.data.params["horovod.HOROVOD_FUSION_THRESHOLD"] == str(8 * 1024 * 1024)
