"""An idle Horovod worker leaves the cores to the work (scripts/horovod-patches/0007).

Upstream, the background loop negotiates with every rank once per cycle time (1 ms in hvdsync) whether or not
anything was submitted; on a host without spare cores those empty rounds slow the workers' own compute. With the
patch a rank with nothing outstanding waits for work. Two real 2-worker jobs, the patched default and
HOROVOD_IDLE_WAIT_MS=0 (upstream's loop), measure the CPU an idle worker process uses, and that an op submitted late
by one rank still completes as soon as that rank submits it. A third job, with a process set that leaves a rank out,
checks that the patch keeps upstream's loop there (the left-out rank would otherwise hold every cycle up).
"""
import pytest

from hvdsync import launch


def _idle_worker():
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    t = torch.ones(1000)
    hvd.allreduce_(t, name="idle.warm")
    # Nothing outstanding for 1.5 s: process CPU counts every thread (Horovod's loop, Gloo's, torch's).
    hvd.barrier()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(1.5)
    idle_share = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    # Rank 1 submits 0.4 s late, after idling: its own submission must wake its loop, so rank 0's op finishes
    # right after rank 1 submits, not at the end of an idle wait.
    hvd.barrier()
    if hvd.rank() == 1:
        time.sleep(0.4)
    wall0 = time.perf_counter()
    hvd.allreduce_(t, name="idle.late")
    late_wait = time.perf_counter() - wall0
    # Back to back: 50 small all-reduces, each submitted when the previous one is done (the loop idles between).
    wall0 = time.perf_counter()
    for i in range(50):
        hvd.allreduce_(t, name=f"idle.chain.{i}")
    chain_per_op = (time.perf_counter() - wall0) / 50
    off_one = float((t - 1.0).abs().max())           # averages of ones stay ones
    hvd.shutdown()
    return {"idle_share": idle_share, "late_wait_s": late_wait, "chain_per_op_s": chain_per_op, "off_one": off_one}


@pytest.fixture(scope="module")
def idle():
    patched = launch.run(_idle_worker, np=2, progress=False, timeout=180)
    upstream = launch.run(_idle_worker, np=2, progress=False, timeout=180, env={"HOROVOD_IDLE_WAIT_MS": "0"})
    return patched, upstream


def test_an_idle_worker_uses_a_small_share_of_a_core(idle):
    patched, upstream = idle
    shares = [r["idle_share"] for r in patched]
    upstream_shares = [r["idle_share"] for r in upstream]
    print(f"idle CPU share per worker: patched {shares}, upstream loop {upstream_shares}")
    assert max(shares) < 0.05, shares                # 50 cycles a second at most, instead of ~1,000
    assert sum(shares) < sum(upstream_shares) / 2, (shares, upstream_shares)


def test_ops_still_complete_when_a_rank_submits_late(idle):
    for results in idle:
        assert [r["off_one"] for r in results] == [0.0, 0.0]   # the largest |result - 1| on each rank
        assert results[0]["late_wait_s"] > 0.3       # rank 0 really waited for rank 1 ...
        assert results[1]["late_wait_s"] < 0.3       # ... which found rank 0 there
    patched, upstream = idle
    print("late wait (rank 0):", patched[0]["late_wait_s"], "upstream", upstream[0]["late_wait_s"],
          "| per chained op:", patched[0]["chain_per_op_s"], "upstream", upstream[0]["chain_per_op_s"])


def _pair_busy_third_idle():
    import statistics
    import time

    import horovod.torch as hvd
    import torch

    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    t = torch.ones(1000)
    hvd.barrier()
    times = []
    if hvd.rank() in (0, 1):
        for i in range(10):
            wall0 = time.perf_counter()
            hvd.allreduce_(t, name=f"pair.{i}", process_set=pair)
            times.append(time.perf_counter() - wall0)
    else:
        time.sleep(3.0)                  # nothing outstanding (not even a barrier) while the pair works
    hvd.barrier()
    hvd.shutdown()
    return statistics.median(times) if times else None


def test_a_process_set_that_leaves_a_rank_out_keeps_upstreams_loop():
    # Every cycle negotiates the global set with all ranks; were rank 2 (outside the pair, nothing to submit)
    # allowed to wait for work, each of the pair's ops would wait up to HOROVOD_IDLE_WAIT_MS for it: 200 ms here
    # (measured on a build without the rule: 0.2 s per op).
    per_op = launch.run(_pair_busy_third_idle, np=3, progress=False, timeout=180,
                        env={"HOROVOD_IDLE_WAIT_MS": "200"})
    print("pair's median all-reduce, rank 2 idle:", per_op)
    assert per_op[2] is None
    assert max(per_op[:2]) < 0.05, per_op
