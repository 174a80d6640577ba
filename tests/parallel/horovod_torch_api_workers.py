"""Worker script of tests/parallel/test_horovod_torch_api.py: Horovod's own PyTorch API on the pinned torch, no
hvdsync. Run by ``horovodrun -np 2 -H localhost:2 --gloo python horovod_torch_api_workers.py OUT_DIR``; every rank
writes ``OUT_DIR/rank<r>.pt`` (a dict of what it computed), and the test compares the ranks with each other and with
one-process runs of :func:`data` it makes itself.
"""
import inspect
import sys

import horovod.torch as hvd
import torch
from torch import nn

STEPS, MICRO, BATCH = 4, 2, 8


def data(step, micro, rank):
    """The samples rank `rank` reads in micro-batch `micro` of step `step` (the same on any number of processes)."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def dense_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def sparse_model():
    torch.manual_seed(0)
    return nn.Embedding(20, 4, sparse=True)


def sparse_data(step, rank):
    g = torch.Generator().manual_seed(500 + 10 * step + rank)
    return torch.randint(0, 20, (BATCH,), generator=g), torch.randn(BATCH, 4, generator=g)


def optimizer_classes():
    return [c for c in vars(torch.optim).values()
            if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer]


# Classes whose broadcast is not checked here, and why (the test asserts this list is all that is skipped).
SKIPPED = {"LBFGS": "Horovod's broadcast_optimizer_state refuses it by design ('cannot broadcast torch.optim.LBFGS "
                    "state'); the test checks that error"}


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def distributed_optimizer(compression, rank):
    model = dense_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=compression,
                                   backward_passes_per_step=MICRO)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(MICRO):
            x, y = data(step, micro, rank)
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return _params(model)


def sparse_gradients(rank):
    model = sparse_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    for step in range(STEPS):
        opt.zero_grad()
        idx, y = sparse_data(step, rank)
        nn.functional.mse_loss(model(idx), y).backward()
        assert model.weight.grad.is_sparse
        opt.step()
    return _params(model)


def adasum(rank):
    """Adasum on CPU is MPI's (AdasumMPIAllreduceOp): under ``horovodrun --mpi`` it combines the ranks' vectors;
    under Gloo the op fails with Horovod's message, for this tensor only (it runs last here all the same)."""
    g = torch.Generator().manual_seed(77 + rank)
    t = torch.randn(64, generator=g, dtype=torch.float64)
    try:
        return {"input": t, "combined": hvd.allreduce(t, op=hvd.Adasum, name="adasum.t"), "error": None}
    except RuntimeError as e:
        return {"input": t, "combined": None, "error": str(e)}


def _make(cls, rank):
    """A model and an optimizer of class `cls` with rank-specific parameters, hyperparameters and state."""
    torch.manual_seed(100 + rank)
    if cls is torch.optim.SparseAdam:        # takes dense params, steps only on sparse gradients
        model = nn.Embedding(20, 4, sparse=True)
    else:
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    params = list(model.parameters())
    if cls.__name__ == "Muon":               # Muon accepts 2-D parameters only: give it the two weight matrices
        params = [p for p in params if p.dim() == 2]
    opt = cls(params, lr=0.01 * (rank + 1))
    for step in range(2):                    # state (moments, step counts) that differs between the ranks
        def closure(step=step):
            opt.zero_grad()
            if isinstance(model, nn.Embedding):
                idx, y = sparse_data(step, rank)
                loss = nn.functional.mse_loss(model(idx), y)
            else:
                x, y = data(step, 0, rank)
                loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)
    return model, opt


def _snapshot(model, opt):
    state = opt.state_dict()
    tensors = {f"{i}.{k}": (v.clone() if torch.is_tensor(v) else torch.tensor(v))
               for i, s in state["state"].items() for k, v in s.items()}
    groups = [{k: v for k, v in g.items() if k != "params" and isinstance(v, (int, float, bool))}
              for g in state["param_groups"]]
    return {"params": _params(model), "state": tensors, "groups": groups}


def broadcast_all(rank):
    out = {}
    for cls in optimizer_classes():
        name = cls.__name__
        model, opt = _make(cls, rank)
        if name in SKIPPED:
            try:
                hvd.broadcast_optimizer_state(opt, root_rank=0)
                out[name] = {"error": None}
            except ValueError as e:
                out[name] = {"error": str(e)}
            continue
        before = _snapshot(model, opt)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        out[name] = {"before": before, "after": _snapshot(model, opt)}
    return out


def process_sets(rank, sets):
    own = sets[rank]
    t = torch.tensor([float(rank + 1)])
    return {"own": hvd.allreduce(t, op=hvd.Sum, process_set=own, name="ps.own"),
            "global": hvd.allreduce(t, op=hvd.Sum, name="ps.global"),
            "own_size": own.size(), "own_rank": own.rank()}


def main(out_dir, only=None):
    if only == "adasum":                     # the MPI job: Adasum alone
        hvd.init()
        torch.save({"adasum": adasum(hvd.rank())}, f"{out_dir}/rank{hvd.rank()}.pt")
        return
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
    hvd.init(process_sets=sets)
    torch.set_num_threads(1)
    r = hvd.rank()
    result = {"size": hvd.size(),
              "dense": distributed_optimizer(hvd.Compression.none, r),
              "dense_fp16": distributed_optimizer(hvd.Compression.fp16, r),
              "sparse": sparse_gradients(r),
              "broadcast": broadcast_all(r),
              "process_sets": process_sets(r, sets)}
    result["adasum"] = adasum(r)
    torch.save(result, f"{out_dir}/rank{r}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
