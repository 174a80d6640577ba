"""Train one model once per sync mode from the same start over the same samples, in the workers of one job: the
side-by-side comparison that notebooks and tests of the sync modes make, for either framework.

The lab modules of each framework call :func:`train_modes` with their ``init``/``build``
(:func:`hvdlab.torch.modes.train_modes`, :func:`hvdlab.tensorflow.modes.train_modes`); this module stays
framework-free.
"""
from __future__ import annotations

from typing import Callable

from hvdsync.core.comm.schemes.local_sgd import ParameterTrace


def train_modes(cfg_dict: dict, modes: dict[str, dict], init: Callable, build: Callable, reseed: Callable[[int], None],
                prepare: Callable | None = None, trace: bool = False, keep_params: bool = True) -> dict[str, dict]:
    """Train ``cfg_dict``'s model once per entry of ``modes`` (name -> ``sync`` overrides); every rank calls it.

    Args:
        init, build: the adapter's ``init(cfg)`` and ``build(cfg, data)`` (a backend with an ``optimizer``).
        reseed: ``reseed(seed)`` seeds the framework before each build, so every mode starts from the same model.
        prepare: ``prepare(optimizer)`` before training (e.g. switch on gossip's consensus tracking).
        trace: record the parameters' fingerprint after every step (:class:`ParameterTrace`).
        keep_params: return the final parameters (numpy arrays).

    Returns, per name: ``rounds`` (collective rounds the optimizer issued, counted as it issued them; for
    ``allreduce`` the gradient tensors handed to Horovod over the gradients per round), ``accuracy``, per-epoch
    ``history`` of test accuracy, ``wire``, ``traffic`` (a sync-mode optimizer's byte counts, else None), gossip's
    ``consensus``, ``fingerprints`` (with ``trace``), ``steps``, ``seconds``, ``spread`` and ``params``.
    """
    from hvdsync.config import Config  # here: hvdsync.config imports the core
    from hvdsync.datasets import load
    from hvdsync.fitting import fit_loop

    base = Config.from_dict(cfg_dict)
    init(base)
    data = load(base.data, base.train.seed)
    out = {}
    for name, sync in modes.items():
        cfg = base.replace(sync=sync)
        reseed(cfg.train.seed)
        backend = build(cfg, data)
        opt = backend.optimizer
        if prepare is not None:
            prepare(opt)
        tracer = ParameterTrace()
        result = fit_loop(cfg, backend, data, callbacks=[tracer] if trace else ())
        rounds = getattr(opt, "rounds", None)
        out[name] = {"rounds": int(rounds) if rounds is not None else result.wire["tensors"] // backend.grad_tensors,
                     "fingerprints": tracer.fingerprints, "accuracy": result.test_accuracy,
                     "history": [h["test_accuracy"] for h in result.history], "wire": result.wire,
                     "traffic": getattr(opt, "traffic", None), "consensus": getattr(opt, "consensus", None),
                     "steps": result.optimizer_steps, "seconds": result.total_seconds,
                     "spread": result.param_spread}
        if keep_params:
            out[name]["params"] = [p.copy() for p in backend.parameters()]
    return out
