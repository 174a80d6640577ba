"""Runs inside each of 2 Horovod workers (sent by value): many PyTorch checks on one pair of workers.

Every check returns numbers; tests/parallel/test_torch.py asserts on them. Sharing the workers keeps the suite
fast (a Horovod start-up costs seconds) while each assertion stays a separate test.
"""
import numpy as np


def _sequential_reference(x, y, plan, n_steps, seed, hidden, lr):
    """Plain PyTorch, one process, no Horovod: hvdlab.torch.reference.sequential_sgd from the same initial model."""
    import torch

    from hvdlab.torch.reference import global_batches, sequential_sgd
    from hvdsync.torch import mlp

    torch.manual_seed(seed)
    return sequential_sgd(mlp(x.shape[1], hidden, 10), x, y, global_batches(plan, steps=n_steps), lr)


def run_checks(n_steps=12, batch=16, hidden=32, lr=0.2, seed=3):
    import horovod.torch as hvd
    import torch

    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.core.train._scaling import loss_scale
    from hvdsync.core.train._plan import ShardPlan
    from hvdsync.torch import TorchBackend, init, mlp

    cfg = Config.from_dict({"train": {"seed": seed}, "tracking": {"enabled": False}})
    init(cfg)
    rank, size = hvd.rank(), hvd.size()
    data = datasets.digits(seed=seed)
    x, y = data.x_train, data.y_train
    out = {"size": size}

    def distributed(sync, per_rank_batch, x=x, y=y, steps=n_steps):
        torch.manual_seed(seed)
        model = mlp(x.shape[1], hidden, 10)
        backend = TorchBackend(model, torch.optim.SGD(model.parameters(), lr=lr), sync)
        plan = ShardPlan(len(x), size, per_rank_batch, sync.accumulate, seed=seed)
        read = []
        for step in plan.epoch(0, rank)[:steps]:
            read.append(step.indices)
            backend.train_step([(x[m], y[m]) for m in step.micro], loss_scale(step.global_count, size, sync.op))
        params = backend.parameters()
        return backend, params, np.concatenate(read) if read else np.empty(0, int)

    sync = Config().sync
    # 1. 2 workers x B == 1 process x 2B, same samples.
    b1, p_dist, read = distributed(sync, batch)
    ref_plan = ShardPlan(len(x), 1, size * batch, 1, seed=seed)
    p_ref = _sequential_reference(x, y, ref_plan, n_steps, seed, hidden, lr)
    out["equivalence_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(p_dist, p_ref))
    out["param_change"] = max(float(np.abs(a - b).max()) for a, b in zip(p_ref, _sequential_reference(
        x, y, ref_plan, 0, seed, hidden, lr)))
    all_read = hvd.allgather(torch.from_numpy(read)).numpy()
    ref_read = np.concatenate([s.indices for s in ref_plan.epoch(0, 0)[:n_steps]])
    out["samples_read"], out["reference_samples"] = np.sort(all_read).tolist(), np.sort(ref_read).tolist()
    out["samples_read_twice"] = int(len(all_read) - len(np.unique(all_read)))
    out["grad_tensors"] = b1.grad_tensors
    out["plain_rounds"] = b1.wire.snapshot()["tensors"] / b1.grad_tensors
    out["plain_wire"] = b1.wire.snapshot()
    out["numel"] = int(sum(p.size for p in p_dist))

    # 2. accumulate=k of B == one batch of B; one allreduce round per k backward passes.
    k = 4
    b4, p_acc, _ = distributed(Config.from_dict({"sync": {"accumulate": k}}).sync, batch)
    out["accumulate"] = k
    out["accumulation_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(p_acc, p_dist))
    out["accumulation_rounds"] = b4.wire.snapshot()["tensors"] / b4.grad_tensors

    # 3. fp16 on the wire.
    b16, p16, _ = distributed(Config.from_dict({"sync": {"compression": "fp16"}}).sync, batch)
    out["fp16_wire"] = b16.wire.snapshot()
    out["fp16_rounds"] = b16.wire.snapshot()["tensors"] / b16.grad_tensors
    out["fp16_vs_fp32_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(p16, p_dist))

    # 3b. Horovod's float16 sum itself (Gloo): sizes around the 8-wide F16C loop and its scalar tail, a fused pair
    # whose second tensor starts at an odd offset, values from subnormal to large. Each rank draws both ranks'
    # values, so the reference is local: float32 sum of the two float16 values, rounded once to float16 (what
    # both the vector loop and the scalar tail compute), and for Average that sum times 1/2, rounded again.
    def halves(n, who):
        g = torch.Generator().manual_seed(1000 * n + who)
        scale = torch.tensor([1e-6, 1e-2, 1.0, 3e3])[torch.randint(0, 4, (n,), generator=g)]
        return (torch.randn(n, generator=g) * scale).half()

    sizes = (1, 7, 8, 9, 1003, 65_537)
    mismatches = {}
    for n in sizes:
        a, b = halves(n, 0), halves(n, 1)
        want_sum = (a.float() + b.float()).half()
        want_avg = (want_sum.float() * 0.5).half()
        mine = a if rank == 0 else b
        for op, want in (("sum", want_sum), ("average", want_avg)):
            got = hvd.allreduce(mine, name=f"h16.{op}.{n}", op=hvd.Sum if op == "sum" else hvd.Average)
            mismatches[f"{op} {n}"] = int((got.view(torch.int16) != want.view(torch.int16)).sum())
    pair = [(halves(13, r), halves(4099, r)) for r in (0, 1)]
    got = hvd.grouped_allreduce(list(pair[rank]), op=hvd.Sum, name="h16.fused")
    for i, t in enumerate(got):
        want = (pair[0][i].float() + pair[1][i].float()).half()
        mismatches[f"fused {t.numel()}"] = int((t.view(torch.int16) != want.view(torch.int16)).sum())
    out["float16_sum_mismatches"] = mismatches
    out["float16_sum_dtypes"] = sorted({str(t.dtype) for t in got})

    # 3c. Waiting for an all-reduce sleeps (scripts/horovod-patches/0005): rank 1 joins 0.5 s late, and rank 0's
    # waiting thread must not burn a core meanwhile (Horovod's unpatched wait spins on yield: about the whole wait in
    # CPU). thread_time counts this thread only, not Horovod's or Gloo's. In place, the result is exact.
    import time

    n = 1 << 18
    t = (torch.arange(n) % 7 + rank + 1).float()
    hvd.barrier()
    if rank == 1:
        time.sleep(0.5)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Average, name="wait.sleeps"))
    out["wait_wall_s"], out["wait_thread_cpu_s"] = time.perf_counter() - wall0, time.thread_time() - cpu0
    out["in_place_average_mismatches"] = int((t != (torch.arange(n) % 7).float() + 1.5).sum())

    # 4. Uneven data: 101 samples, B=8, accumulate=3 -> a short last step, some empty micro-batches.
    xs, ys = x[:101], y[:101]
    uneven_sync = Config.from_dict({"sync": {"accumulate": 3}}).sync
    plan = ShardPlan(101, size, 8, 3, seed=seed)
    bu, p_uneven, read_u = distributed(uneven_sync, 8, xs, ys, steps=plan.steps_per_epoch())
    p_uneven_ref = _sequential_reference(xs, ys, ShardPlan(101, 1, size * 8, 1, seed=seed),
                                         plan.steps_per_epoch(), seed, hidden, lr)
    out["uneven_steps"] = plan.steps_per_epoch()
    out["uneven_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(p_uneven, p_uneven_ref))
    out["uneven_read"] = sorted(hvd.allgather(torch.from_numpy(read_u)).numpy().tolist())

    # 5. SyncBatchNormalization: rank 0 holds 5 rows, rank 1 holds 3; statistics must be those of all 8 rows.
    from hvdsync.torch import SyncBatchNormalization

    rows = np.random.default_rng(11).normal(2.0, 3.0, size=(8, 6)).astype(np.float32)
    mine = torch.from_numpy(rows[:5] if rank == 0 else rows[5:]).requires_grad_(True)
    bn = SyncBatchNormalization(6, momentum=1.0)   # momentum 1: running stats = this batch's stats
    out_sync = bn(mine)
    full = torch.nn.BatchNorm1d(6, momentum=1.0)(torch.from_numpy(rows))
    expected = full[:5] if rank == 0 else full[5:]

    def worst(value):  # the largest value over both ranks, so both ranks report the same number
        return hvd.allreduce(torch.tensor(float(value)), op=hvd.Max).item()

    out["syncbn_output_max_diff"] = worst((out_sync - expected).abs().max())
    out["syncbn_mean_max_diff"] = worst((bn.running_mean - torch.from_numpy(rows.mean(0))).abs().max())
    out["local_mean_off_by"] = worst((mine.mean(0) - torch.from_numpy(rows.mean(0))).abs().max())

    # 6. After build: one model on every rank, but torch draws per rank from then on (dropout masks differ).
    from hvdsync.torch import build

    built = build(cfg, data)
    draws = hvd.allgather(torch.rand(1, 8)).numpy()
    out["draw_difference_after_build"] = float(np.abs(draws[0] - draws[1]).max())
    fp = np.concatenate([p.ravel() for p in built.parameters()])
    out["built_model_spread"] = float(np.ptp(hvd.allgather(torch.from_numpy(fp).reshape(1, -1)).numpy(), axis=0).max())

    # 7. Every model above is identical on every rank.
    fps = [np.concatenate([p.ravel() for p in ps]) for ps in (p_dist, p_acc, p16, p_uneven)]
    gathered = [hvd.allgather(torch.from_numpy(f).reshape(1, -1)).numpy() for f in fps]
    out["cross_rank_max_diff"] = max(float(np.abs(g[0] - g[1]).max()) for g in gathered)
    return out
