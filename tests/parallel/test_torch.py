"""PyTorch adapter on real Horovod workers (2 processes, Gloo).

One pair of workers runs every numeric check (tests/parallel/torch_workers.py) and returns the numbers; each test
asserts one promise. Two more launches train for real: the CLI and a plain `horovodrun` user script.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import cloudpickle
import pytest

from hvdsync import launch
from tests.parallel import torch_workers

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
cloudpickle.register_pickle_by_value(torch_workers)


@pytest.fixture(scope="module")
def checks():
    results = launch.run(torch_workers.run_checks, np=2, progress=False)
    assert len(results) == 2
    return results


def test_two_workers_match_one_process_with_twice_the_batch(checks):
    r = checks[0]
    assert r["size"] == 2
    assert r["samples_read"] == r["reference_samples"]   # both ranks together read the sequential run's samples
    assert r["samples_read_twice"] == 0
    assert r["param_change"] > 1e-2                # training moved the parameters ...
    assert r["equivalence_max_diff"] < 1e-5        # ... and the parallel run moved them exactly like the sequential one


def test_accumulation_equals_the_big_batch_with_one_allreduce_per_k_passes(checks):
    r = checks[0]
    assert r["accumulation_max_diff"] < 1e-5
    assert r["plain_rounds"] == 12                 # one round per optimizer step
    assert r["accumulation_rounds"] == 12          # still 12 rounds for 12 * k = 48 backward passes


def test_fp16_gradients_travel_as_fp16(checks):
    r = checks[0]
    assert r["plain_wire"]["dtypes"] == ["float32"]
    assert r["fp16_wire"]["dtypes"] == ["float16"]
    assert r["plain_wire"]["bytes"] == 4 * r["numel"] * r["plain_rounds"]
    assert r["fp16_wire"]["bytes"] == 2 * r["numel"] * r["fp16_rounds"]
    assert 0 < r["fp16_vs_fp32_max_diff"] < 1e-2   # rounding shows, but only at fp16 precision


def test_horovods_float16_sum_is_the_float32_sum_rounded_once(checks):
    # Bit for bit, on both ranks: the F16C loop (scripts/horovod-patches/0004), its scalar tail (sizes not a
    # multiple of 8) and a fused tensor at an odd offset, with op=Sum and op=Average (the postscale).
    for r in checks:
        assert len(r["float16_sum_mismatches"]) == 2 * 6 + 2
        assert r["float16_sum_mismatches"] == {k: 0 for k in r["float16_sum_mismatches"]}
        assert r["float16_sum_dtypes"] == ["torch.float16"]


def test_waiting_for_an_allreduce_does_not_spin(checks):
    # Rank 0 waited ~0.5 s for a late rank 1 in hvd.synchronize; the waiting thread slept (patch 0005) instead of
    # spinning on yield, which took a core from Horovod's and Gloo's threads (docs/measurements/allreduce.md, "Where the
    # time goes").
    r = checks[0]
    assert r["wait_wall_s"] > 0.3
    assert r["wait_thread_cpu_s"] < 0.1 * r["wait_wall_s"], r
    assert [c["in_place_average_mismatches"] for c in checks] == [0, 0]


def test_uneven_data_reads_every_sample_once_without_deadlock(checks):
    r = checks[0]
    assert r["uneven_read"] == list(range(101))
    assert r["uneven_max_diff"] < 1e-5             # the loss scale weights the short last step correctly


def test_sync_batch_norm_uses_the_statistics_of_the_whole_batch(checks):
    r = checks[0]
    assert r["local_mean_off_by"] > 0.5            # one rank's rows alone would give other statistics ...
    assert r["syncbn_mean_max_diff"] < 1e-5        # ... the synchronised layer uses all 8 rows
    assert r["syncbn_output_max_diff"] < 1e-5


def test_after_build_ranks_share_the_model_but_not_the_random_draws(checks):
    assert checks[0]["built_model_spread"] == 0.0
    assert checks[0]["draw_difference_after_build"] > 0   # dropout masks and noise differ between ranks


def test_parameters_identical_across_ranks(checks):
    assert checks[0]["cross_rank_max_diff"] == 0.0
    # Both ranks measured the same numbers; the wait's timings are per rank (rank 1 waits for rank 0's late start).
    # So is the codec's time in a wire snapshot (codec_seconds); its counts are not.
    per_rank = {"wait_wall_s", "wait_thread_cpu_s"}

    def same(check):
        return {k: ({kk: vv for kk, vv in v.items() if kk != "codec_seconds"} if isinstance(v, dict) else v)
                for k, v in check.items() if k not in per_rank}

    assert same(checks[0]) == same(checks[1])


def test_cli_trains_digits_with_fp16_and_accumulation_and_records_the_run(tmp_path):
    db = tmp_path / "mlflow.db"
    proc = subprocess.run(
        [str(BIN / "hvdsync"), "train", "--framework", "torch", "--np", "2", "--compression", "fp16",
         "--accumulate", "4", "--tracking-uri", f"sqlite:///{db}", "--experiment", "cli-test", "--json",
         "--log-dir", str(tmp_path / "logs")],
        # A knob set in the user's environment wins over the config, and rank 0 says so once: a known worker line.
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "HOROVOD_CACHE_CAPACITY": "512"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["test_accuracy"] >= 0.90
    assert result["world_size"] == 2 and result["param_spread"] == 0.0
    assert result["wire"]["dtypes"] == ["float16"]
    assert result["backward_passes"] == 4 * result["optimizer_steps"]
    assert result["allreduce_rounds"] == result["optimizer_steps"]
    # Quiet by default: worker lines went to the log file, not to the terminal.
    log = (tmp_path / "logs" / "workers.log").read_text()
    assert "HOROVOD_CACHE_CAPACITY=512 from the environment wins" in log
    assert not re.search(r"\[\d\]<std(out|err)>", proc.stdout + proc.stderr)
    # The run record is in the MLflow store.
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    run = client.get_run(result["run_id"])
    assert run.data.params["sync.compression"] == "fp16" and run.data.params["world_size"] == "2"
    assert run.data.params["sync.cache_capacity"] == "512"  # the value that applied, not the config's 1024
    assert run.data.metrics["final_test_accuracy"] == pytest.approx(result["test_accuracy"])
    from hvdsync.core.telemetry.tracking import EPOCH_METRICS, FINAL_METRICS

    assert set(EPOCH_METRICS + FINAL_METRICS) <= set(run.data.metrics)  # + per-step, per-rank, system metrics
    assert {"ranks/loss_min", "ranks/loss_max", "ranks/step_seconds_slowest_rank", "step/comm_share",
            "monitor/param_spread"} <= set(run.data.metrics)
    assert not any(k.startswith("rank/") for k in run.data.metrics)   # per rank: the ranks.csv artifact
    history = client.get_metric_history(run.info.run_id, "test_accuracy")
    assert len(history) == result["epochs"]


def test_plain_horovodrun_script_trains_and_gets_the_fusion_threshold_it_records(tmp_path):
    """The example, unchanged, under plain `horovodrun`: it trains, `--set sync.fusion_threshold_mb=8` reaches
    Horovod inside each worker (read back there), and the MLflow record states that value."""
    db = tmp_path / "m.db"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    env.pop("HOROVOD_FUSION_THRESHOLD", None)
    # Each worker runs the example as its main script, then prints what its own environment held for Horovod.
    read_back = ("import json, os, runpy, horovod.torch as hvd\n"
                 f"runpy.run_path({str(ROOT / 'examples' / 'train_torch.py')!r}, run_name='__main__')\n"
                 "print('KNOBS', json.dumps({'rank': hvd.rank(),\n"
                 "                           'fusion': os.environ.get('HOROVOD_FUSION_THRESHOLD')}))")
    proc = subprocess.run(
        [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", read_back,
         "--set", "train.epochs=6", "--set", "sync.fusion_threshold_mb=8"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if "test accuracy" in ln)
    accuracy = float(line.split("test accuracy")[1].split()[0])
    assert accuracy >= 0.90
    assert "params equal across ranks: True" in line
    knobs = [json.loads(ln.split("KNOBS", 1)[1]) for ln in proc.stdout.splitlines() if "KNOBS" in ln]
    assert sorted(k["rank"] for k in knobs) == [0, 1]
    assert [k["fusion"] for k in knobs] == [str(8 * 1024 * 1024)] * 2   # 8 MiB inside both workers
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["sync.fusion_threshold_mb"] == "8"
    assert run.data.params["horovod.HOROVOD_FUSION_THRESHOLD"] == str(8 * 1024 * 1024)
