"""The link benchmark's fair harness (hvdlab.bench.link_fair, link_report, link_ddp; benchmarks/link.py): placement
read from inside a worker and a contender refused by name, the A B A B order, the record's rows from repeats, the
accuracy statistics and the test set's size, DDP's sample order and its PowerSGD priming. Nothing is timed."""
import os
import socket
import statistics
from pathlib import Path

import numpy as np
import pytest

from hvdlab.bench import link_ddp, link_fair
from hvdlab.bench.link_report import accuracy_summary, aggregate, versus_ddp
from tests import benchmark_scripts

ROOT = Path(__file__).resolve().parents[2]


def _link_module():
    return benchmark_scripts.load("link")


def _worker(host, cpus, threads, pid=1):
    return {"host": host, "cpus": cpus, "threads": threads, "pid": pid}


def test_a_worker_reads_its_own_affinity_and_threads():
    import torch

    got = link_fair.placement("torch")
    assert got["cpus"] == sorted(os.sched_getaffinity(0))
    assert got["threads"] == torch.get_num_threads()
    assert got["host"] == socket.gethostname()
    # What this process reports passes against its own cores and threads, and is refused against any other.
    link_fair.check_placement({got["host"]: got["cpus"]}, got["threads"], {"here": [got]})
    with pytest.raises(link_fair.PlacementError, match="'here'"):
        link_fair.check_placement({got["host"]: got["cpus"]}, got["threads"] + 1, {"here": [got]})
    with pytest.raises(ValueError, match="framework"):
        link_fair.placement("jax")


def test_a_contender_whose_workers_do_not_match_is_refused_by_name():
    cpus = {"node1": [0], "node2": [1]}
    fair = [_worker("node1", [0], 1), _worker("node2", [1], 1)]
    link_fair.check_placement(cpus, 1, {"hvdsync-torch": fair, "ddp": fair})
    unpinned = [_worker("node1", [0, 1], 1, pid=77), _worker("node2", [1], 1)]   # the rank started without ssh
    with pytest.raises(link_fair.PlacementError, match=r"contender 'ddp' refused: .*node1 \(pid 77\) runs on cores "
                                                      r"0,1 .*\(0 on node1\) with 1 thread"):
        link_fair.check_placement(cpus, 1, {"hvdsync-torch": fair, "ddp": unpinned})
    two_threads = [_worker("node1", [0], 2), _worker("node2", [1], 2)]
    with pytest.raises(link_fair.PlacementError, match="'hvdsync-torch' refused: .* with 2 thread"):
        link_fair.check_placement(cpus, 1, {"hvdsync-torch": two_threads, "ddp": fair})
    with pytest.raises(link_fair.PlacementError, match="'ddp' refused: a worker runs on host 'node3'"):
        link_fair.check_placement(cpus, 1, {"ddp": [_worker("node3", [1], 1)]})
    with pytest.raises(link_fair.PlacementError, match="'ddp' refused: its workers reported no placement"):
        link_fair.check_placement(cpus, 1, {"ddp": []})
    assert link_fair.expected_threads({"node1": [0, 1], "node2": [2, 3]}, 1) == 2
    assert link_fair.expected_threads({"node1": [0, 1], "node2": [2, 3]}, 2) == 1


def test_contenders_run_interleaved_and_every_repeat_has_its_own_seed():
    assert link_fair.schedule(["hvdsync-torch", "ddp"], 3) == [
        (0, "hvdsync-torch"), (0, "ddp"), (1, "hvdsync-torch"), (1, "ddp"), (2, "hvdsync-torch"), (2, "ddp")]
    with pytest.raises(ValueError, match="repeats"):
        link_fair.schedule(["a"], 0)
    seeds = [link_fair.seed_for(k, r, 3) for k in range(4) for r in range(3)]
    assert sorted(seeds) == list(range(12))


def _runs():
    """3 repeats at 1gbit: hvdsync none and DDP, step times and accuracies chosen by hand."""
    hv, dd, acc_hv, acc_dd = [30.0, 36.0, 33.0], [40.0, 30.0, 44.0], [0.80, 0.82, 0.78], [0.79, 0.80, 0.80]
    rows = []
    for r in range(3):
        rows.append({"rate": "1gbit", "framework": "torch", "compression": "none", "step_ms": hv[r],
                     "accuracy": acc_hv[r], "repeat": r, "seed": 3 + r, "test_samples": 2560})
        rows.append({"rate": "1gbit", "framework": "torch", "compression": "ddp", "step_ms": dd[r],
                     "accuracy": acc_dd[r], "repeat": r, "seed": 3 + r, "test_samples": 2560})
    return rows, hv, dd


def test_versus_ddp_rows_carry_the_median_ratio_its_spread_and_the_repeats():
    runs, hv, dd = _runs()
    (row,) = versus_ddp(runs)
    ratios = [a / b for a, b in zip(hv, dd)]   # paired within each repeat: 0.75, 1.2, 0.75
    assert {"rate", "hvdsync", "ddp", "ratio", "repeats", "spread"} <= set(row)
    assert (row["rate"], row["hvdsync"], row["ddp"], row["repeats"]) == ("1gbit", "none", "ddp", 3)
    assert row["ratio"] == pytest.approx(statistics.median(ratios)) == pytest.approx(0.75)
    assert row["spread"] == pytest.approx([0.75, 1.2])
    assert row["hvdsync_ms"] == 33.0 and row["ddp_ms"] == 40.0
    assert row["accuracy_delta"] == pytest.approx(np.mean([0.01, 0.02, -0.02]))


def test_rows_are_medians_of_their_repeats_and_accuracy_is_over_seeds():
    runs, hv, dd = _runs()
    rows = {r["compression"]: r for r in aggregate([{**r, "link_bytes_per_step": 1.0} for r in runs])}
    assert rows["none"]["step_ms"] == 33.0 and rows["none"]["step_spread"] == [30.0, 36.0]
    assert rows["ddp"]["step_ms"] == 40.0 and rows["ddp"]["repeats"] == 3 and rows["ddp"]["seeds"] == [3, 4, 5]
    acc = {a["run"]: a for a in accuracy_summary(runs)}
    assert acc["none"]["mean"] == pytest.approx(0.80) and acc["none"]["sd"] == pytest.approx(0.02)
    assert acc["none"]["seeds"] == 3 and acc["none"]["standard_error"] == pytest.approx((0.16 / 2560) ** 0.5)


def test_the_test_set_makes_one_accuracy_point_more_than_its_standard_error():
    link = _link_module()
    cfg = link.build("torch", ["none", "powersgd:2", "local_sgd:4"], quick=False)[0]
    n = link.test_samples(cfg)
    assert n > 1600
    assert link_fair.accuracy_stats([0.8, 0.8], n)["standard_error"] < 0.01
    # The training set is the one the earlier records trained on in size: 24 global steps of 2 x 32 an epoch.
    assert cfg.data.synthetic_samples - n == 1536 and cfg.data.batch_size == 32


def test_bus_fraction_is_the_ring_s_bytes_per_link_over_the_link_s_rate():
    assert link_fair.bus_fraction(16 << 20, 2, 1.0, 16 << 20) == pytest.approx(1.0)
    assert link_fair.bus_fraction(16 << 20, 4, 2.0, 16 << 20) == pytest.approx(0.75)


def test_ddp_reads_hvdsync_s_shuffled_plan():
    from hvdsync.config import Config
    from hvdsync.fitting import plan_for

    cfg = Config.from_dict({"data": {"batch_size": 32}, "train": {"seed": 4}})
    plan = plan_for(cfg, 1536, 2)
    for epoch in (0, 1):
        for rank in (0, 1):
            got = link_ddp.order(1536, 2, 32, 4, epoch, rank)
            assert [g.tolist() for g in got] == [s.indices.tolist() for s in plan.epoch(epoch, rank)]
    unshuffled = np.arange(1536)[0::2][:32]
    assert link_ddp.order(1536, 2, 32, 4, 0, 0)[0].tolist() != unshuffled.tolist()


_PRIMED = """
import socket
import torch
import torch.distributed as dist
from torch import nn
from hvdlab.bench import link_ddp

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)))
state = link_ddp._hook(model, "ddp-powersgd:2")
before = [p.detach().clone() for p in model.parameters()]
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
link_ddp.prime(model, x, y)
assert state.iter == state.start_powerSGD_iter == link_ddp.PRIMING, (state.iter, state.start_powerSGD_iter)
assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))   # priming steps no optimizer
assert all(p.grad is None for p in model.parameters())
nn.functional.cross_entropy(model(x), y).backward()
assert state.total_numel_after_compression > 0   # the first training step went through PowerSGD
print("primed")
"""


def test_ddp_powersgd_is_primed_to_compress_from_the_first_training_step():
    # In a process of its own: a Gloo process group and DDP's reducer in the test runner's process once hung in the
    # group's destructor (joining its threads) when the test ended, under pytest-xdist.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PRIMED], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "primed", out.stdout[-2000:] + out.stderr[-2000:]


def _hvdsync_result(step_s, sync_share, wire_bytes, steps=10, compression="none"):
    """What hvdsync's job returns for one run, as summarise reads it: a step and its sync share, the wire."""
    return {"history": [{"step_seconds_max_rank": 9.0}, {"step_seconds_max_rank": step_s}],
            "phase_seconds": {"compute": 1 - sync_share, "sync_wait": sync_share}, "optimizer_steps": steps,
            "wire": {"bytes": wire_bytes * steps}, "link_bytes": {"sent": wire_bytes * steps},
            "config": {"sync": {"mode": "allreduce", "compression": compression}, "train": {"framework": "torch"}},
            "numel": 100, "test_accuracy": 0.8, "param_spread": 0.0}


def test_the_cost_model_predicts_from_the_link_fitted_over_it_with_call_messages_bytes_and_reduction():
    from hvdlab import costmodel
    from hvdlab.bench.link_report import summarise

    # A link fitted to two all-reduces that the model reproduces exactly: alpha 50 us, 100 MB/s, gamma 0.1 ns/B.
    truth = costmodel.Link(50e-6, 1e-8, 1e-10, call=2e-3)
    sizes = [1 << 20, 16 << 20]
    fitted = costmodel.fit_link(sizes, [truth.call + costmodel.ring_time(s, 2, truth) for s in sizes], 2,
                                gamma=truth.gamma, call=truth.call)
    assert fitted.alpha == pytest.approx(50e-6, rel=1e-6) and fitted.beta == pytest.approx(1e-8, rel=1e-6)
    wire = 8e6
    row = summarise(_hvdsync_result(0.2, 0.5, wire, compression="fp16"), "1gbit", 1.25e8, 0.003, fitted)
    # compute (half the 0.2 s step) + the codec + one call + the ring's 2 messages + the bytes + half of them added
    expected = 0.1 + 0.003 + 2e-3 + 2 * 50e-6 + wire * 1e-8 + wire / 2 * 1e-10
    assert row["predicted_ms"] == pytest.approx(1e3 * expected)
    # PowerSGD's two rounds a step pay the call and the ring's messages twice, the bytes once.
    two = summarise(_hvdsync_result(0.2, 0.5, wire, compression="powersgd:2"), "1gbit", 1.25e8, 0.003, fitted)
    assert two["predicted_ms"] - row["predicted_ms"] == pytest.approx(1e3 * (2e-3 + 2 * 50e-6))


def test_the_cost_model_summary_counts_configurations_within_the_band_and_names_the_others():
    from hvdlab.bench.link_report import costmodel_fit

    rows = [{"rate": "1gbit", "framework": "torch", "compression": c, "step_ms": 100.0, "predicted_ms": p}
            for c, p in (("none", 101.0), ("fp16", 79.0), ("powersgd:2", 125.0))]
    rows.append({"rate": "1gbit", "framework": "torch", "compression": "ddp", "step_ms": 90.0, "predicted_ms": None})
    (c,) = costmodel_fit(rows)
    assert (c["configs"], c["within"]) == (3, 2) and c["share"] == pytest.approx(2 / 3)
    assert c["outside"] == [{"run": "fp16", "ratio": pytest.approx(0.79)}]
