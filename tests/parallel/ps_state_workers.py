"""Runs inside each Horovod worker (sent by value): a parameter server's sharded optimizer state through elastic
commits and durable checkpoints, on the real code path (``hvdsync.torch.elastic_state``, ``CheckpointStore``).

Each run trains hvdsync's MLP on digits with ``sync.mode: ps`` for ``k`` steps, commits (rank 0 writes a
checkpoint), and goes on for ``k`` more; resumed runs start from *another* random model, load the checkpoint on
rank 0 (the elastic state's first sync hands it on) and train the same ``k`` steps. Every run returns its final
parameters and its whole optimizer state (``consolidate_state_dict``); tests/parallel/test_ps_state.py compares.
The global batch is 32 samples whatever the world size (16 per rank at 2 workers, 32 at 1).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

GLOBAL_BATCH = 32
OPTIMIZERS = ("sgd", "adam")


def _config(ckpt: Path, k: int, servers: int = 0, mode: str = "ps", resume: bool = False):
    import horovod.torch as hvd

    from hvdsync.config import Config

    size = hvd.size()
    return Config.from_dict({
        "sync": {"mode": mode, "ps_servers": servers if mode == "ps" else 0},
        "data": {"batch_size": GLOBAL_BATCH // size},
        "train": {"np": size, "lr": 0.05, "seed": 3},
        "tracking": {"enabled": False},
        "elastic": {"checkpoint_dir": str(ckpt), "commit_every": k, "resume": resume}})


def _optimizer(name: str, model):
    import torch

    if name == "adam":  # its state has a scalar (step) beside the per-element moments
        return torch.optim.Adam(model.parameters(), lr=0.002, weight_decay=1e-4)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)


def _whole_state(optimizer) -> dict:
    """Every element-wise state tensor of the optimizer, per parameter index, as numpy (a collective for PS)."""
    state = _torch_state(optimizer)["state"]
    return {f"{i}.{k}": np.array(v.detach().cpu().numpy(), copy=True) for i, s in state.items()
            for k, v in s.items() if hasattr(v, "dim") and v.dim() > 0}


def _steps(backend, loader, state, n: int, commit: bool = False) -> None:
    """``n`` optimizer steps from the state's position; with ``commit`` the elastic state counts them (and commits,
    rank 0 checkpointing, every ``elastic.commit_every``)."""
    import horovod.torch as hvd

    from hvdsync.core.train._scaling import loss_scale

    for i, (micro, step) in enumerate(loader.epoch_steps(0, loader.start)):
        if i == n:
            break
        backend.train_step(micro, loss_scale(step.global_count, hvd.size(), "average"))
        loader.start += step.global_count
        if commit:
            state.step_done(step.global_count)


def _run(data, opt_name: str, ckpt: Path, k: int, *, seed: int, servers: int = 0, mode: str = "ps",
         resume: bool = False, detour: int = 0, zero_state: bool = False) -> dict:
    """One run: fresh, ``k`` steps, a commit (rank 0 checkpoints), ``k`` more; or resumed from
    the checkpoint, ``k`` steps. ``detour``: that many uncommitted steps after the commit, then a restore.
    ``zero_state``: resumed, with the optimizer state then zeroed (what an owner had before: a control)."""
    import horovod.torch as hvd
    import torch

    from hvdsync.core.train.loader import PlanLoader
    from hvdsync.fitting import plan_for
    from hvdsync.registry import build_model
    from hvdsync.torch.elastic import elastic_state
    from hvdsync.torch.train import build

    cfg = _config(ckpt, k, servers, mode, resume)
    torch.manual_seed(seed)  # resumed runs start from another model: only the checkpoint can make them agree
    model = build_model(cfg, data, "torch")
    backend = build(cfg, data, model=model, optimizer=_optimizer(opt_name, model), broadcast=False)
    state = elastic_state(backend.model, backend.optimizer, cfg)  # with resume: rank 0 loads the checkpoint
    state.sync()  # rank 0's model, whole optimizer state and position to every rank
    loader = PlanLoader(data.x_train, data.y_train, plan_for(cfg, len(data.x_train), hvd.size()), hvd.rank())
    loader.start = state.position.consumed
    if zero_state:
        whole = _torch_state(backend.optimizer)
        backend.optimizer.load_state_dict({"param_groups": whole["param_groups"], "state": {
            i: {key: torch.zeros_like(v) for key, v in s.items()} for i, s in whole["state"].items()}})
    if resume:
        _steps(backend, loader, state, k)
    else:
        _steps(backend, loader, state, k, commit=True)  # the commit after step k writes the checkpoint
        if detour:
            _steps(backend, loader, state, detour)
            state.restore()  # the model, the whole optimizer state and the position of step k, on every rank
            loader.start = state.position.consumed
        _steps(backend, loader, state, k)
    return {"params": backend.parameters(), "state": _whole_state(backend.optimizer), "size": hvd.size()}


def _torch_state(optimizer) -> dict:
    if hasattr(optimizer, "consolidate_state_dict"):
        optimizer.consolidate_state_dict()
    return optimizer.state_dict()


def same_world(root: str, k: int = 8) -> dict:
    """On 2 workers: uninterrupted runs, resumes at the same world (into 2 shards, 1 shard, plain all-reduce), a
    restore after uncommitted steps, and the control without optimizer state."""
    from hvdsync.config import Config
    from hvdsync.datasets import load
    from hvdsync.torch.runtime import init

    cfg = Config.from_dict({"tracking": {"enabled": False}})
    init(cfg)
    data = load(cfg.data, 3)
    root = Path(root)
    out = {}
    for opt in OPTIMIZERS:
        sharded, single = root / opt / "sharded", root / opt / "single"
        out[opt] = {
            "whole": _run(data, opt, sharded, k, seed=1),
            "single_whole": _run(data, opt, single, k, seed=1, servers=1),   # and a one-server checkpoint
            "resumed": _run(data, opt, sharded, k, seed=2, resume=True),
            "resumed_one_server": _run(data, opt, sharded, k, seed=2, servers=1, resume=True),
            "one_server_resumed_sharded": _run(data, opt, single, k, seed=2, resume=True),
            "resumed_allreduce": _run(data, opt, sharded, k, seed=2, mode="allreduce", resume=True),
            "restored": _run(data, opt, root / opt / "detour", k, seed=1, detour=3),
            "zeroed": _run(data, opt, sharded, k, seed=2, resume=True, zero_state=True),
            # Plain all-reduce through the same commit and resume (weight decay: a zero-gradient step moves weights).
            "allreduce_whole": _run(data, opt, root / opt / "allreduce", k, seed=1, mode="allreduce"),
            "allreduce_resumed": _run(data, opt, root / opt / "allreduce", k, seed=2, mode="allreduce", resume=True),
        }
    return out


def other_world(root: str, k: int = 8) -> dict:
    """On 1 worker: resume the checkpoints written by 2 workers (2 shards become 1)."""
    from hvdsync.config import Config
    from hvdsync.datasets import load
    from hvdsync.torch.runtime import init

    cfg = Config.from_dict({"tracking": {"enabled": False}, "train": {"np": 1}})
    init(cfg)
    data = load(cfg.data, 3)
    return {opt: _run(data, opt, Path(root) / opt / "sharded", k, seed=2, resume=True) for opt in OPTIMIZERS}
