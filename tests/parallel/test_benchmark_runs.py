"""The benchmark suites (``benchmarks/<suite>.py``) run every path end to end in tiny configurations, and check what
they measure: ``allreduce.py --quick`` (every reduced result checked), ``training.py --quick``, ``knobs.py`` (a tiny
sweep, and ``idle-loop``), ``step.py tf-apply`` and ``step.py latency``, ``shares.py``; and ``--record`` keeps a run as
a record in the index (``step.py fp16``: ``test_fp16_step.py``).

No timing is asserted (the machine is shared; figures live in benchmarks/results/): these tests check that the
benchmark measures what it says: all variants, all sizes, positive finite times, results verified element by
element on every rank, and a wrong reduction failing the run instead of producing a figure.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hvdlab.bench import records
from hvdsync.config import SyncConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "allreduce.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--quick", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = _bench("--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_every_variant_and_size_has_positive_finite_times_and_verified_results(quick):
    doc, stdout = quick
    assert set(doc["variants"]) == {"horovod", "hvdsync", "torch"}
    assert doc["baseline"] == "torch"
    sizes = {f"{s:g}" for s in doc["sizes_mb"]}
    assert len(sizes) >= 2
    for name, variant in doc["variants"].items():
        assert set(variant["sizes"]) == sizes, name
        for size, row in variant["sizes"].items():
            for key in ("median_ms", "p10_ms", "p90_ms", "algbw_gbs", "ratio"):
                assert math.isfinite(row[key]) and row[key] > 0, (name, size, key, row[key])
            assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"], (name, size, row)
            assert row["n"] == doc["iters"], (name, size)
            # Every timed and warm-up iteration was compared with the exact result on every rank.
            assert row["verified_iterations"] == doc["iters"] + doc["warmup"] * doc["rounds"], (name, size)
        assert variant["sizes"][next(iter(sizes))]["ratio"] > 0
    assert all(doc["variants"]["torch"]["sizes"][s]["ratio"] == 1.0 for s in sizes)
    # The printed table has one row per variant and size, and the per-size ratios.
    for label in ("(a) Horovod defaults", "(b) hvdsync defaults", "(c) torch.distributed"):
        assert stdout.count(label) >= len(sizes), label


def test_each_variant_ran_with_the_knobs_it_claims(quick):
    doc, stdout = quick
    variants = doc["variants"]
    # (a): Horovod's built-in defaults (no tuning variable at hvd.init), out of place.
    assert variants["horovod"]["spec"]["call"] == "allreduce"
    assert not {"HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_FUSION_THRESHOLD"} & set(
        variants["horovod"]["seen"])
    # (b): in place, as hvd.DistributedOptimizer does, with every SyncConfig knob as the workers saw it (an
    # unpatched horovod.runner.run handed them "(None,)" for two of them: scripts/horovod-patches/0003).
    assert variants["hvdsync"]["spec"]["call"] == "allreduce_"
    want = SyncConfig().horovod_env()
    assert {k: variants["hvdsync"]["seen"].get(k) for k in want} == want
    assert doc["knobs_lost_by_launcher"] == {} and "WARNING" not in stdout
    # One intra-op thread everywhere, and everything over loopback.
    for name in ("horovod", "hvdsync", "torch"):
        assert variants[name]["seen"]["torch_threads"] == 1
    for name in ("horovod", "hvdsync"):
        assert variants[name]["seen"]["HOROVOD_GLOO_IFACE"] == "lo"
    assert variants["torch"]["seen"]["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.parametrize("variant", ["torch", "hvdsync"])
def test_a_wrong_reduction_fails_the_run(variant):
    proc = _bench("--variants", variant, "--inject-error")
    assert proc.returncode != 0
    assert "allreduce is wrong" in proc.stdout + proc.stderr


# ---- benchmarks/training.py: step time side by side, parameters checked against one process ----------------------
TRAINING = ROOT / "benchmarks" / "training.py"


def _training(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    out, md = tmp_path / "training.json", tmp_path / "training.md"
    proc = subprocess.run([sys.executable, str(TRAINING), "--quick", "--json", str(out), "--md", str(md), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text()), md.read_text()


@pytest.fixture(scope="module")
def torch_training(tmp_path_factory):
    # One run for all torch assertions: every step-table contender, with DDP deliberately skipping its all-reduce
    # (the test-only --wrong switch): it is then faster than it should be, and must be reported wrong, not fast.
    return _training(tmp_path_factory.mktemp("training"), "--framework", "torch", "--model", "mlp", "--no-knobs",
                     "--only", "fit,api,raw,ddp", "--wrong", "ddp")


# Each run starts 4-5 jobs of workers: ~40 s on a quiet machine, many minutes on a loaded one (setup included).
@pytest.mark.timeout(1500)
def test_training_table_has_every_torch_contender_and_checks_their_parameters(torch_training):
    proc, doc, md = torch_training
    rows = doc["blocks"]["torch mlp"]["rows"]
    assert set(rows) == {"single", "fit", "api", "raw", "ddp"}
    for name, row in rows.items():
        assert row["checked"] and row["n"] == doc["blocks"]["torch mlp"]["work"]["steps"], (name, row)
        assert math.isfinite(row["median_ms"]) and row["median_ms"] > 0, name
        assert row["label"] in proc.stdout and row["label"] in md, name
    # Two workers averaging their halves end where one process on the whole batch does, up to float rounding.
    for name in ("fit", "api", "raw"):
        assert rows[name]["correct"] and rows[name]["relative_error"] < 1e-4, (name, rows[name])
        assert rows[name]["rank_spread"] == 0.0, name
    ratios = doc["blocks"]["torch mlp"]["ratios"]
    assert ratios["fit/raw"]["ratio"] > 0 and ratios["api/raw"]["ratio"] > 0
    assert rows["api"]["bytes_per_step"] == 4 * doc["blocks"]["torch mlp"]["numel"]  # float32, every parameter


@pytest.mark.timeout(1500)
def test_a_contender_that_skips_its_allreduce_is_reported_wrong_not_fast(torch_training):
    proc, doc, md = torch_training
    row = doc["blocks"]["torch mlp"]["rows"]["ddp"]
    assert row["checked"] and not row["correct"] and row["relative_error"] > 0.1
    assert not any(k.startswith("ddp/") or k.endswith("/ddp") for k in doc["blocks"]["torch mlp"]["ratios"])
    assert "WRONG" in proc.stdout and "WRONG" in md
    assert proc.returncode == 3 and "torch mlp: ddp" in proc.stderr


@pytest.mark.timeout(1500)
def test_training_tensorflow_contenders_match_one_process(tmp_path):
    proc, doc, md = _training(tmp_path, "--framework", "tensorflow", "--model", "cnn", "--no-knobs",
                              "--only", "api,raw,mwms", "--wrong", "raw")
    rows = doc["blocks"]["tensorflow cnn"]["rows"]
    assert set(rows) == {"single", "api", "raw", "mwms"}
    assert rows["api"]["correct"] and rows["api"]["relative_error"] < 1e-4
    assert rows["mwms"]["correct"] and rows["mwms"]["relative_error"] < 1e-4, rows["mwms"]
    assert rows["raw"]["checked"] and not rows["raw"]["correct"]
    assert proc.returncode == 3


# ---- benchmarks/knobs.py idle-loop: the compute of idle workers, plain / Horovod with 0007 / upstream's loop -------
def _script_json(tmp_path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``benchmarks/<script>`` with ``args`` (a part's name first, where the suite has several) and ``--json``;
    it must succeed; returns its output and JSON."""
    out = tmp_path / f"{script}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_idle_loop_times_every_contender_in_every_round_and_is_recorded(tmp_path):
    # Recorded into a results folder of the test's own: the run's output and JSON become a record of the knobs
    # suite, listed in that folder's index, as `make bench` records into benchmarks/results/.
    # 2 rounds (the rotated order and the per-round ratios need more than one), but a quarter of a second of timed
    # compute per start: each start runs 20 untimed steps first, and no figure's size is asserted, only that it
    # was taken (~4 s less; the 6 starts, ~9 s each on 2 cores, are the rest of the test's time).
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "knobs.py"), "--record", "quick", "--results",
                           str(results), "idle-loop", "--rounds", "2", "--seconds", "0.25"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [name] = records.manifests(results)["knobs"]["records"]
    assert name.endswith("-idle-loop-quick")
    assert [p.name for p in records.files(results / "knobs", name)] == [f"{name}.json", f"{name}.txt"]
    assert records.unlisted(results) == [] and f"(knobs/{name}.json)" in (results / records.INDEX).read_text()
    doc = json.loads((results / "knobs" / f"{name}.json").read_text())
    assert (results / "knobs" / f"{name}.txt").read_text() in proc.stdout   # the record holds what was printed
    assert len(doc["rounds"]) == 2
    for r in doc["rounds"]:
        assert set(r) == {"plain", "horovod", "upstream"}
        for name, row in r.items():
            assert 0 < row["cpu"] <= row["wall"] + 0.5, (name, row)   # the thread's CPU fits in its wall time
            assert 0 < row["share"] <= 2.0, (name, row)                # a share of the 2 cores
    assert doc["step_over_plain"]["plain"] == [1.0, 1.0]
    for name in ("plain", "horovod", "upstream"):
        assert proc.stdout.count(f"\n{name} ") == 1, name            # one table row per contender


# ---- benchmarks/knobs.py (the sweep): each configuration its own pair of workers, torch.distributed beside them -----
def test_knob_sweep_runs_each_configuration_against_torch_distributed(tmp_path):
    doc = _script_json(tmp_path, "knobs.py", "--quick", "--part", "dtype")[1]
    assert set(doc["parts"]) == {"dtype"}
    dtype = doc["parts"]["dtype"]
    assert set(dtype["variants"]) == {"d_fp32", "d_fp16", "torch", "torch_fp16"}
    for name, variant in dtype["variants"].items():
        assert set(variant["sizes"]) == {f"{s:g}" for s in dtype["sizes_mb"]}, name
        for size, row in variant["sizes"].items():
            assert math.isfinite(row["median_ms"]) and row["median_ms"] > 0, (name, size)
            assert row["verified_iterations"] > 0 and row["ratio"] > 0, (name, size)  # every result was checked
        assert variant["seen"]["torch_threads"] == 1, name
    assert all(row["ratio"] == 1.0 for row in dtype["variants"]["torch"]["sizes"].values())
    assert dtype["variants"]["d_fp16"]["spec"]["dtype"] == "float16"


# ---- benchmarks/step.py tf-apply and latency: contenders interleaved step by step in the same workers -------------
def test_tf_apply_overhead_runs_every_contender_to_raw_horovods_parameters(tmp_path):
    rows = _script_json(tmp_path, "step.py", "tf-apply", "--steps", "2", "--warmup", "1")[1]["rows"]
    assert set(rows) == {"raw", "api", "api_sums", "api_before", "fit_step", "fit_3graphs"}
    assert rows["raw"]["step_over_raw"] == 1.0
    for name, row in rows.items():
        assert row["step_ms"] > 0 and row["cpu_ms"] > 0 and row["graph_ops"] > 0, (name, row)
        assert row["param_diff"] <= 1e-6, (name, row)  # the same 3 SGD steps as raw Horovod's, fit's loss scale too
    # fit's one graph holds fewer ops than its three graphs did (the sums are neither read back nor re-added).
    assert rows["fit_step"]["graph_ops"] < rows["fit_3graphs"]["graph_ops"]


def test_step_latency_times_every_contender_and_they_end_alike(tmp_path):
    jobs = _script_json(tmp_path, "step.py", "latency", "--steps", "3", "--warmup", "1")[1]["jobs"]
    horovod, plain = jobs["horovod, cycle 1 ms"], jobs["plain processes (no Horovod)"]
    assert horovod["params_equal"] is True  # hooks, grouped, fit's step and DDP: the same parameters after the steps
    for name in ("local", "hooks", "grouped", "grouped_spin", "fit_step", "ddp"):
        assert horovod[name]["step"] > 0 and horovod[name]["fwdbwd"] > 0, name
    assert horovod["grouped"]["rounds_per_step"] == 1.0 and horovod["hooks"]["rounds_per_step"] >= 1.0
    assert set(plain) == {"local", "ddp"}


# ---- benchmarks/shares.py: equal against adaptive shares, with the order of the two runs alternating ---------------
def test_shares_benchmark_runs_both_orders_and_reports_what_it_measured(tmp_path):
    proc, doc = _script_json(tmp_path, "shares.py", "--framework", "tensorflow", "--rounds", "2", "--epochs", "3",
                             "--hidden", "256", "--samples", "4096")
    tf = doc["frameworks"]["tensorflow"]
    assert tf["order"] == ["equal first", "adaptive first"]           # the second round runs adaptive first
    assert len(tf["ratios"]) == len(tf["bounds"]) == len(tf["adaptive_own_bounds"]) == 2
    assert all(0 < x < 2 for x in tf["ratios"] + tf["bounds"] + tf["adaptive_own_bounds"]), tf
    for row in tf["runs"]:
        assert row["param_spread"] == 0.0, row["run"]                  # ranks end identical in every run
        if "equal" in row["run"]:
            assert all(s == [0.5, 0.5] for s in row["share_history"]), row
        if "adaptive" in row["run"]:
            assert row["share_history"][0] == [0.5, 0.5] and row["shares"][1] < 0.5, row   # rank 1 is 2x slower
        if "slower" in row["run"]:
            assert len(row["us_per_sample"]) == 2 and row["us_per_sample"][1] > row["us_per_sample"][0], row
    growth = tf["growth"]
    assert growth["growth_rounds"][-1] < growth["constant_rounds"][-1]  # counted all-reduces fall as the batch grows
    assert proc.stdout.count("adaptive first") == 1 and proc.stdout.count("equal first") == 1
