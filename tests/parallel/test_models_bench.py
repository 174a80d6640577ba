"""``benchmarks/models.py --quick`` runs every path of the model benchmark (the compute alone, DDP's three bucket
sizes, hvdsync's and DDP's runs in the protocol's order) on 2 local ranks, and writes a record of the protocol's form.

No timing is asserted (the machine is shared; figures live in benchmarks/results/): the test checks what the run
measured and kept: the order ABBA in every repeat, every run's per-step times, DDP's three bucket sizes with the
fastest used, the placement and threads read inside every worker, the ratio inside its interval, and the form the
record check reads.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hvdlab.bench import protocol

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "models.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "models.py"), "--quick", "--codecs", "none",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_the_record_has_the_protocols_form(quick):
    doc, _ = quick
    assert protocol.problems(doc) == []
    assert doc["quick"] is True and doc["protocol"]["order"] == "abba" and doc["protocol"]["repeats"] == 2
    # A --quick run is never a kept record.
    assert protocol.record_problems(doc)[0].startswith("quick:")


def test_the_runs_follow_abba_and_keep_every_step(quick):
    doc, _ = quick
    (row,) = doc["rows"]
    steps = doc["protocol"]["steps"]
    order = [(r["repeat"], r["contender"]) for r in row["runs"]]
    assert order == protocol.schedule(["hvdsync", "ddp"], 2)
    for run in row["runs"]:
        assert len(run["steps_s"]) == steps
        assert all(math.isfinite(t) and t > 0 for t in run["steps_s"])
        assert run["mean_s"] == pytest.approx(sum(run["steps_s"]) / steps)


def test_the_ratio_is_the_repeats_means_and_sits_in_its_interval(quick):
    doc, stdout = quick
    (row,) = doc["rows"]
    assert (row["model"], row["framework"], row["ranks"], row["rate"], row["codec"], row["contender"]) == \
        ("resnet50", "torch", 2, "none", "none", "ddp")
    hv, ddp = row["per_repeat_s"]["hvdsync"], row["per_repeat_s"]["ddp"]
    assert row["ratio"] == pytest.approx(sum(hv) / sum(ddp))
    assert row["ci"][0] <= row["ratio"] <= row["ci"][1]
    assert f"hvdsync / DDP {row['ratio']:.3f}" in stdout


def test_ddp_is_tuned_and_the_fastest_bucket_is_used(quick):
    doc, _ = quick
    (row,) = doc["rows"]
    assert sorted(float(k) for k in row["ddp_buckets_s"]) == [1.0, 25.0, 100.0]
    assert row["ddp_buckets_s"][min(row["ddp_buckets_s"], key=row["ddp_buckets_s"].get)] == \
        min(row["ddp_buckets_s"].values())
    assert row["ddp_bucket_cap_mb"] == float(min(row["ddp_buckets_s"], key=row["ddp_buckets_s"].get))
    assert row["ddp_settings"] == {"gradient_as_bucket_view": True, "static_graph": True}


def test_every_worker_reported_its_placement_from_inside(quick):
    doc, _ = quick
    (row,) = doc["rows"]
    # 2 ranks per run; ABBA: each contender runs twice in each of the 2 repeats; DDP's tuning job besides.
    assert len(row["placement"]["hvdsync"]) == 2 * 2 * 2 and len(row["placement"]["ddp"]) == (1 + 2 * 2) * 2
    for workers in row["placement"].values():
        assert {w["threads"] for w in workers} == {row["threads"]}
        assert all(w["cpus"] for w in workers)
    assert row["gradient_tensors"] == 161 and row["gradient_bytes"] == 4 * 25_557_032
    # Loopback has no rate to set the ring against: no compute_to_comm, which only rate none may lack.
    assert row["compute_to_comm"] is None and row["compute_s"] > 0
