"""The TensorFlow adapter on real Horovod workers (2 local Gloo processes).

TensorFlow's import is the slow part, so the in-worker checks share one launch (``tensorflow_workers.run_all``: a module-scoped
fixture) and the tests below assert on the numbers it brings back. Three more launches test what a user runs: the
``hvdsync`` CLI for both frameworks on one YAML config (into one MLflow store), and ``horovodrun`` on the example.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from hvdsync.launch.local import horovod_frameworks, run
from tests.parallel import tensorflow_workers

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TOL = 1e-5  # float32 sums in a different order differ by ~1e-7; a wrong scale or a missed sample moves weights ~1e-1

# TensorFlow's start-up lines on any CPU: oneDNN forced on (on AVX-512 CPUs it is on by default and TensorFlow says so
# through absl before it reads TF_CPP_MIN_LOG_LEVEL; elsewhere it is off and silent), and TensorFlow's own level unset.
LOUD_TENSORFLOW = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | {"TF_ENABLE_ONEDNN_OPTS": "1"}
STARTUP_LINE = re.compile(r"^.*(?:oneDNN custom operations|cpu_feature_guard|absl::InitializeLog).*$", re.M)

pytestmark = pytest.mark.skipif("tensorflow" not in horovod_frameworks(), reason="Horovod built without TensorFlow")

# Workers unpickle the checks by value: they need not import the tests package.
cloudpickle.register_pickle_by_value(tensorflow_workers)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' results of every in-worker check (one launch, ~20-60 s on 2 cores)."""
    log_dir = tmp_path_factory.mktemp("tf-workers")
    uri = f"sqlite:///{log_dir / 'mlflow.db'}"
    results = run(tensorflow_workers.run_all, kwargs={"tracking_uri": uri}, np=2, progress=False, log_dir=log_dir,
                  env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    for r in results:
        r["log"], r["tracking_uri"] = (log_dir / "workers.log").read_text(), uri
    return results


@pytest.fixture(scope="module")
def root(ranks):
    return ranks[0]


def test_the_launchers_workers_print_no_tensorflow_start_up_line(root):
    # oneDNN forced on: TensorFlow writes its absl lines at import, before it reads TF_CPP_MIN_LOG_LEVEL; the
    # launcher filters them in every worker, whatever imports TensorFlow first (here horovod.tensorflow).
    assert STARTUP_LINE.findall(root["log"]) == []


# ---- equivalence with one process -----------------------------------------------------------------------------------
def test_two_workers_of_batch_b_equal_one_plain_keras_process_of_batch_2b(root):
    even = root["even"]
    assert even["steps"] == 12  # 96 samples / (2 x 8), 2 epochs
    assert even["max_diff"] < TOL
    assert even["moved"] > 1e-2  # the weights really moved: equality is not the trivial "nothing happened"


def test_k_micro_batches_with_accumulate_k_equal_one_batch_with_one_allreduce_per_k_passes(root):
    acc, even = root["accumulate"], root["even"]
    for a, b in zip(acc["params"], even["params"]):
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)
    assert acc["max_diff"] < TOL
    assert acc["passes"] == 4 * acc["steps"] == 48
    # One grouped all-reduce of the 4 gradient tensors per step, however many backward passes it took.
    assert acc["wire"]["tensors"] == acc["steps"] * acc["grad_tensors"]
    assert acc["rounds"] == acc["steps"] == acc["passes"] / 4


def test_grad_norm_asked_after_the_step_is_the_last_updates_gradient(ranks):
    # Plain SGD: the last update moved the parameters by lr x the reduced gradient; grad_norm() reads that gradient
    # (left in the sums by the update, overwritten by the next step's first pass), the same on every rank.
    for name in ("even", "accumulate", "uneven"):
        got = [r[name] for r in ranks]
        assert got[0]["grad_norm"] > 1e-3, name
        assert got[0]["grad_norm"] == pytest.approx(got[0]["update_norm"], rel=1e-4), name
        assert got[0]["grad_norm"] == got[1]["grad_norm"], name


def test_fit_one_graph_step_puts_a_late_ranks_wait_in_sync_wait(ranks):
    # Rank 1 starts each step LATE_S late. The step is one graph timed by its own clock reads; placed wrong, rank 0's
    # wait would land in compute or update instead.
    c0, c1 = ranks[0]["phases"], ranks[1]["phases"]
    late = c0["steps"] * tensorflow_workers.LATE_S
    for c in (c0, c1):  # one graph per step, the three-graph path never taken
        assert c["steps"] >= 6 and c["traces"]["step_first"] == 1 and c["traces"]["synchronize"] == 0, c
    assert c0["phases"]["sync_wait"] >= 0.8 * late, c0
    assert c0["phases"]["compute"] + c0["phases"]["update"] < 0.5 * late, c0
    assert c1["phases"]["sync_wait"] < 0.5 * late, c1


def test_fit_trains_a_model_with_a_variable_the_loss_never_touches(ranks):
    for r in ranks:
        u = r["unused_variable"]
        assert u["steps"] == 4 and u["spread"] == 0.0, u          # 64 samples, 2 ranks x 8: 4 steps, ranks alike
        assert u["unused_change"] == [0.0, 0.0], u                  # the unused head's kernel and bias stayed
        assert len(u["used_change"]) == 4 and [c for c in u["used_change"] if not c > 0] == [], u   # the rest moved


def test_uneven_data_every_rank_runs_the_same_steps_and_matches_one_process(ranks):
    # 101 samples, 2 ranks x 8, accumulate 3: the last step holds 5 samples (3 + 2; one rank has an empty micro-batch).
    uneven = [r["uneven"] for r in ranks]
    assert [u["steps"] for u in uneven] == [14, 14]
    assert [u["passes"] for u in uneven] == [42, 42]
    assert [u["wire"]["tensors"] for u in uneven] == [14 * 4, 14 * 4]
    assert uneven[0]["max_diff"] < TOL and uneven[0]["moved"] > 1e-2


def test_apply_gradients_in_tf_function_updates_every_kth_call_and_matches_one_process(ranks):
    for r in ranks:
        got = r["apply_gradients"]
        # The wrapped optimizer's iterations after each call: accumulate=4, 64 samples / 16 per step.
        assert got["updates"] == [0] + [call // 4 for call in range(1, 17)]
        assert got["wire"]["tensors"] == 4 * got["grad_tensors"]  # counted at run time, not once at trace time
        assert got["traces"] == 1
    assert ranks[0]["apply_gradients"]["max_diff"] < TOL and ranks[0]["apply_gradients"]["moved"] > 1e-2


# ---- what goes on the wire ------------------------------------------------------------------------------------------
def test_fp16_hands_float16_to_horovod_and_still_learns_digits(ranks):
    for r in ranks:
        fp16 = r["fp16"]
        assert fp16["wire"]["dtypes"] == ["float16"]
        assert fp16["wire"]["bytes"] == 2 * fp16["elements"] * fp16["steps"]
        assert fp16["rounds"] == fp16["steps"]
        assert fp16["accuracy"] >= 0.90
    for name in ("even", "accumulate", "uneven"):
        assert ranks[0][name]["wire"]["dtypes"] == ["float32"]
        assert ranks[0][name]["wire"]["bytes"] == 4 * ranks[0][name]["elements"] * ranks[0][name]["steps"]
    # The values really went through float16 (not only the counter): the same run as "even" ends a little apart.
    half, full = ranks[0]["even_fp16"], ranks[0]["even"]
    assert half["wire"]["dtypes"] == ["float16"] and half["wire"]["bytes"] == 2 * half["elements"] * half["steps"]
    apart = max(float(np.max(np.abs(a - b))) for a, b in zip(half["params"], full["params"]))
    assert 0.0 < apart < 1e-2


# ---- state across ranks ---------------------------------------------------------------------------------------------
def test_parameters_are_equal_across_ranks_after_training(ranks):
    for r in ranks:
        assert [r[name]["spread"] for name in ("even", "accumulate", "uneven", "even_fp16", "fp16")] == [0.0] * 5
    for a, b in zip(ranks[0]["uneven"]["params"], ranks[1]["uneven"]["params"]):
        assert np.array_equal(a, b)


def test_broadcast_gives_every_rank_rank0s_model_and_optimizer_state_even_lazily_built(ranks):
    for r in ranks:
        b = r["broadcast"]
        assert b["before"] > 1.0 and b["after"] == 0.0
        np.testing.assert_allclose(b["fingerprint"], b["root"], rtol=1e-5, atol=1e-8)   # np.allclose's tolerance
        # Adam over 4 variables: iterations, learning rate, 2 moments each = 10 variables, created by the broadcast.
        assert b["lazy_built"] and b["lazy_slots"] == 10 and b["lazy_after"] == 0.0


def test_sync_batch_norm_statistics_equal_those_of_the_concatenated_batch(ranks):
    for r in ranks:
        bn = r["sync_bn"]
        assert max(bn["mean"], bn["var"], bn["mean_vs_numpy"], bn["var_vs_numpy"]) < TOL
        assert bn["out"] < TOL and bn["traced"] < TOL  # eager and in tf.function
        assert bn["grad"] < TOL  # the gradient flows through the all-reduce back to every rank's inputs
        assert bn["local_mean_off"] > 0.1  # each rank's own rows alone give other statistics


def test_tf_data_loader_yields_the_plans_micro_batches(ranks):
    for r in ranks:
        assert r["loader"]["x_diff"] == 0.0 and r["loader"]["y_diff"] == 0.0 and r["loader"]["steps"] == 7
        assert r["loader"]["global_counts"] == [16] * 6 + [5]
    assert sum(ranks[0]["loader"]["sizes"]) + sum(ranks[1]["loader"]["sizes"]) == 101
    assert len(ranks[0]["loader"]["sizes"]) == len(ranks[1]["loader"]["sizes"]) == 7 * 3


# ---- Keras 3: compile + fit ------------------------------------------------------------------------------------------
def test_keras_fit_on_2_workers_equals_plain_keras_on_1_with_twice_the_batch(ranks):
    # 96 samples (6 full steps of 2 x 8 per epoch), and 101 (the last step holds 3 + 2) with steps_per_execution=3:
    # the plan's loss weights keep the short step exact.
    for name in ("keras_even", "keras_uneven_spe3", "keras_accumulate"):
        got = ranks[0][name]
        assert got["max_diff"] < TOL and got["moved"] > 1e-2, name
    assert ranks[0]["keras_uneven_spe3"]["iterations"] == 2 * 7  # 7 steps per epoch, one update each
    assert ranks[0]["keras_even"]["state"] == {"epoch": 1, "consumed": 96}  # the sampler followed training


def test_keras_fit_at_accumulate_1_takes_the_fast_path_and_matches_the_accumulating_one(ranks):
    for r in ranks:
        even, acc = r["keras_even"], r["keras_accumulate"]
        assert even["direct"] and even["sums_abs_max"] == 0.0 and even["passes"] == 0  # no sum variable touched
        assert not acc["direct"] and acc["passes"] == acc["batches"]
        assert even["wire"]["tensors"] == even["steps"] * even["grad_tensors"]  # one grouped all-reduce per step
    # The same global batches: 2 ranks x 1 batch of 8 straight to the all-reduce (no sums) vs 2 ranks x 4 micro-
    # batches of 2 summed in the variables; and vs the shared loop's phases (sums) on the same plan.
    for other in ("keras_accumulate", "even"):
        for a, b in zip(ranks[0]["keras_even"]["params"], ranks[0][other]["params"]):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_keras_accumulate_4_all_reduces_once_per_4_batches_and_fp16_goes_on_the_wire(ranks):
    for r in ranks:
        acc, half = r["keras_accumulate"], r["keras_fp16"]
        assert acc["batches"] == 4 * acc["steps"] == 48  # micro-batches of 2 per rank
        assert acc["iterations"] == acc["steps"] == 12  # one update per 4 batches
        assert acc["wire"]["tensors"] == acc["steps"] * acc["grad_tensors"]  # one grouped all-reduce per update
        assert acc["wire"]["dtypes"] == ["float32"] and acc["wire"]["bytes"] == 4 * acc["elements"] * acc["steps"]
        assert half["wire"]["dtypes"] == ["float16"] and half["wire"]["bytes"] == 2 * half["elements"] * half["steps"]
    apart = max(float(np.max(np.abs(a - b))) for a, b in
                zip(ranks[0]["keras_fp16"]["params"], ranks[0]["keras_accumulate"]["params"]))
    assert 0.0 < apart < 1e-2  # the values really went through float16


def test_keras_ranks_hold_identical_parameters_at_the_end(ranks):
    names = ("keras_even", "keras_uneven_spe3", "keras_accumulate", "keras_fp16", "keras_warmup")
    for r in ranks:
        assert [r[name]["spread"] for name in names] == [0.0] * len(names)
    for name in names:
        for a, b in zip(ranks[0][name]["params"], ranks[1][name]["params"]):
            assert np.array_equal(a, b)


def test_metric_average_makes_rank_0_log_the_figures_over_all_ranks_samples(ranks):
    got = ranks[0]["keras_even"]
    # Validation: 11 samples on rank 0, 19 on rank 1; the last epoch's figure is the final model's on all 30.
    assert got["history"]["val_accuracy"][-1] == pytest.approx(got["val_all"], abs=1e-6)
    assert got["val_ranks"][0] != got["val_ranks"][1]  # so a plain mean of the two would be off
    # Training: each rank saw 48 samples per epoch; rank 0 logs the accuracy over all 96.
    for epoch in range(2):
        local = [r["keras_even"]["local"][epoch]["accuracy"] for r in ranks]
        assert got["history"]["accuracy"][epoch] == pytest.approx(sum(local) / 2, abs=1e-6)
    assert ranks[1]["keras_even"]["history"] == got["history"]  # every rank logs the same figures


def test_mlflow_callback_records_rank_0s_global_metrics(ranks):
    import mlflow

    got = ranks[0]["keras_even"]
    client = mlflow.MlflowClient(tracking_uri=ranks[0]["tracking_uri"])
    run_ = client.get_run(got["run_id"])
    assert run_.info.status == "FINISHED" and run_.data.params["model"] == "mlp"
    history = [m.value for m in client.get_metric_history(got["run_id"], "val_accuracy")]
    assert history == pytest.approx(got["history"]["val_accuracy"])
    assert ranks[1]["keras_even"]["run_id"] is None  # only rank 0 writes


def test_warmup_reaches_the_target_lr_at_the_stated_epoch(root):
    lrs = root["keras_warmup"]["lrs"]  # at each batch: 6 per epoch, 3 epochs, warm-up over 2, target 0.5
    assert len(lrs) == 18
    assert lrs[0] == pytest.approx(tensorflow_workers.LR / 2)  # the one-worker rate (target / world size)
    assert [(i, a, b) for i, (a, b) in enumerate(zip(lrs[:12], lrs[1:12])) if not a < b] == []  # rising in epochs 0, 1
    assert lrs[11] < tensorflow_workers.LR
    assert lrs[12:] == pytest.approx([tensorflow_workers.LR] * 6)  # from epoch 2 on: the target
    assert root["keras_warmup"]["history"]["learning_rate"][1:] == pytest.approx([tensorflow_workers.LR] * 2)


def test_fit_trains_the_users_cnn_with_the_users_loss(ranks):
    for r in ranks:
        got = r["user_cnn"]
        assert got["params"] == 9690  # the same layers as hvdsync.torch.CNN(1, 10, width=16)
        assert got["spread"] == 0.0
    assert ranks[0]["user_cnn"]["accuracy"] >= 0.7  # digits as 8x8 images, 8 epochs of 21 steps


def test_tf_data_plan_stream_reads_every_sample_once_with_equal_batches_per_rank(ranks):
    streams = [r["plan_stream"] for r in ranks]
    read = sorted(streams[0]["read"] + streams[1]["read"])
    assert read == list(range(101))  # exactly once over both ranks
    assert streams[0]["batches"] == streams[1]["batches"] == 7 * 3  # 7 steps x accumulate 3 on each rank
    # Keras takes each batch's weighted mean, the optimizer averages the 3 batches of a step and Horovod the 2 ranks:
    # a sample's share of the update is w / (batch size x 3 x 2), and the shares of every step's samples sum to 1
    # (16 samples in micro-batches of 3, 3, 2 per rank; 5 on the last step).
    for step in range(7):
        shares = [w / (len(batch) * 3 * 2) for s in streams for batch in s["weights"][3 * step:3 * step + 3]
                  for w in batch]
        assert len(set(np.round(shares, 12))) == 1 and sum(shares) == pytest.approx(1.0)
    # Micro-batches of 1 there: weight 1 x accumulate 3 x loss scale (2 ranks / 5 samples) = 1.2 each.
    last = [w for s in streams for batch in s["weights"][18:] for w in batch]
    assert last == pytest.approx([1.2] * 5)
    # A fresh sampler (world of 1) loaded with "48 samples consumed" streams exactly the other 53.
    assert sorted(streams[0]["rest"]) == sorted(set(range(101)) - set(streams[0]["first"]))


# ---- what a user runs -----------------------------------------------------------------------------------------------
CROSS_CONFIG = """\
sync:
  compression: fp16
  accumulate: 2
train:
  epochs: 5
tracking:
  tracking_uri: "sqlite:///{db}"
  experiment: cross-framework
  log_model: true
"""


@pytest.fixture(scope="module")
def cross(tmp_path_factory):
    """One YAML config, trained by the CLI once per framework into one MLflow sqlite store."""
    tmp = tmp_path_factory.mktemp("cross")
    config = tmp / "run.yaml"
    config.write_text(CROSS_CONFIG.format(db=tmp / "mlflow.db"))
    out = {}
    for framework in ("torch", "tensorflow"):
        proc = subprocess.run([str(BIN / "hvdsync"), "train", "--config", str(config), "--framework", framework,
                               "--json", "--log-dir", str(tmp / framework)],
                              capture_output=True, text=True, timeout=600, cwd=tmp, env=LOUD_TENSORFLOW)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[framework] = (json.loads(proc.stdout), proc.stderr)
    return out, f"sqlite:///{tmp / 'mlflow.db'}"


def test_one_yaml_trains_both_frameworks_and_logs_the_same_mlflow_names(cross):
    import mlflow

    results, uri = cross
    client = mlflow.MlflowClient(tracking_uri=uri)
    names = {}
    for framework, (result, stderr) in results.items():
        assert result["framework"] == framework and result["world_size"] == 2
        assert result["test_accuracy"] >= 0.90
        assert result["wire"]["dtypes"] == ["float16"] and result["param_spread"] == 0.0
        assert result["backward_passes"] == 2 * result["optimizer_steps"] == 2 * result["allreduce_rounds"]
        assert f"{framework} x2" in stderr and "100%" in stderr  # rank 0's progress, drawn by the launcher
        # No TensorFlow start-up line from the launching process, which (for torch too) used to import TensorFlow.
        assert STARTUP_LINE.findall(stderr) == []
        run_ = client.get_run(result["run_id"])
        assert run_.info.status == "FINISHED" and run_.data.tags["framework"] == framework
        assert run_.data.params["sync.compression"] == "fp16" and run_.data.params["train.framework"] == framework
        # An alarm is a property of one run, not of its framework.
        names[framework] = (set(run_.data.params), {k for k in run_.data.metrics if not k.startswith("alarm/")})
    assert names["torch"] == names["tensorflow"]
    assert {"test_accuracy", "final_test_accuracy", "wire_bytes", "allreduce_rounds",
            "monitor/grad_norm"} <= names["tensorflow"][1]


def test_each_framework_logs_its_model_summary_and_with_log_model_the_model_mlflow_loads(cross, tmp_path):
    """tracking.log_model: each run's model in MLflow's format under model/, loaded back by MLflow's own flavour:
    it scores the test set as the run reported. model_summary.txt (always) lists the loaded model's tensors."""
    import mlflow

    from hvdsync import datasets
    from hvdsync.config import Config

    results, uri = cross
    client = mlflow.MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    data = datasets.load(Config().data, 0)
    for framework, (result, _) in results.items():
        run_id = result["run_id"]
        summary = Path(client.download_artifacts(run_id, "model_summary.txt", str(tmp_path))).read_text().splitlines()
        assert "model/MLmodel" in [a.path for a in client.list_artifacts(run_id, "model")]
        if framework == "torch":
            import torch

            model = mlflow.pytorch.load_model(f"runs:/{run_id}/model")
            tensors = {n: (tuple(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size())
                       for n, t in model.state_dict().items()}
            with torch.no_grad():
                predicted = model(torch.as_tensor(data.x_test, dtype=torch.float32)).argmax(1).numpy()
        else:
            model = mlflow.keras.load_model(f"runs:/{run_id}/model")
            tensors = {w.path: (tuple(w.shape), str(w.dtype), int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize)
                       for w in model.weights}
            predicted = np.asarray(model(data.x_test.astype(np.float32))).argmax(1)
        assert float((predicted == data.y_test).mean()) == pytest.approx(result["test_accuracy"], abs=1e-6)
        count = sum(int(np.prod(shape)) for shape, _, _ in tensors.values())
        assert summary[1].startswith(f"parameters: {count:,} trainable of {count:,} in {len(tensors)} tensors, "
                                     f"{sum(b for _, _, b in tensors.values()):,} bytes")
        # Keras names a loaded model's weights without the model's own name in front ("dense/kernel").
        prefix = f"{model.name}/" if framework == "tensorflow" else ""
        rows = {line.split()[0].removeprefix(prefix): line.split()[1:4] for line in summary[4:]}
        assert rows == {n: ["x".join(map(str, shape)), dtype, f"{nbytes:,}"]
                        for n, (shape, dtype, nbytes) in tensors.items()}


def test_horovodrun_runs_the_tensorflow_example(tmp_path):
    # The adapter must quiet TensorFlow by itself, also where TensorFlow announces oneDNN (forced here on any CPU).
    env = {**LOUD_TENSORFLOW, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                           str(REPO / "examples" / "train_tensorflow.py"), "--set", "train.epochs=5"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    summary = re.search(r"\[0\]<stdout>:tensorflow x2: test accuracy ([0-9.]+) after 5 epochs.*"
                        r"params equal across ranks: True, MLflow run (\w+)", output)
    assert summary, output[-3000:]
    assert float(summary.group(1)) >= 0.90
    assert "[1]<stdout>:tensorflow x2" not in output  # only rank 0 prints the summary
    # No TensorFlow C++ start-up lines from the workers (lines Horovod prefixes with the rank).
    assert [line for line in STARTUP_LINE.findall(output) if re.match(r"\[\d\]<std", line)] == []
