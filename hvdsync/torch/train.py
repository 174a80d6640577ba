"""``fit`` for PyTorch: the user's model, loss, optimizer and data (or hvdsync's registered ones) driven by the
shared loop (:func:`hvdsync.core.train.loop.fit_loop`) through a :class:`TorchBackend`.

Launch with hvdsync's launcher (``hvdsync train --framework torch --np 2``) or inside any Horovod job::

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch_cnn.py
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hvdsync import datasets
from hvdsync.core.train import runtime, seeding
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.train._context import FitResult
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.telemetry.modelrecord import ModelRecord, TensorRow
from hvdsync.core.telemetry.profiling import PhaseTimer
from hvdsync.core.train._scaling import scaled_lr
from hvdsync.core.train._plan import PlanState
from hvdsync.fitting import fit_loop
from hvdsync.registry import build_model, make_callbacks
from hvdsync.torch.data import LoaderSteps, PlanSampler
from hvdsync.torch.evaluate import dataset_evaluator
from hvdsync.torch.models import local_optimizer
from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer
from hvdsync.torch.precision import MixedPrecision
from hvdsync.torch.runtime import device, init

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_same_model(model: torch.nn.Module) -> None:
    """Fail on every rank, before any training, when the ranks built models with different parameters
    (:func:`hvdsync.core.train.runtime.check_same_model`; Horovod pairs the ranks' gradients by name and shape)."""
    runtime.check_same_model([tuple(p.shape) for p in model.parameters()], lambda row: hvd.allgather(
        torch.tensor([row], dtype=torch.int64), name="hvdsync.model_check").tolist())


class TorchBackend:
    """The PyTorch side of :class:`hvdsync.core.train.loop.Backend`: any ``nn.Module``, loss and local optimizer.

    Args:
        model: the model.
        optimizer: the *local* optimizer over its parameters (wrapped here for Horovod), or one already wrapped
            with ``hvd.DistributedOptimizer`` (then its traffic is not counted).
        sync: a :class:`~hvdsync.config.SyncConfig` (compression, accumulate, op).
        loss: ``loss(outputs, targets)``, the *mean* over the batch (PyTorch's default ``reduction="mean"``);
            default cross-entropy.
        precision: ``fp32``, ``fp16`` or ``bf16`` (:class:`~hvdsync.torch.precision.MixedPrecision`).
        seed: the global seed for the codecs' shared random choices.
        timer: the :class:`~hvdsync.core.telemetry.profiling.PhaseTimer` (or subclass) that times each phase;
            default a new one.
    """

    framework = "torch"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync=None,
                 loss: Loss | None = None, precision: str = "fp32", seed: int = 0, broadcast: bool = True,
                 timer: PhaseTimer | None = None) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        if broadcast:  # an elastic job makes no collective call before its loop (its state's sync checks instead)
            check_same_model(model)
        self.device = device()
        self.model = model.to(self.device)
        self.loss = loss if loss is not None else F.cross_entropy
        self.wire = WireCounter()
        self.timer = timer if timer is not None else PhaseTimer()
        wrapped = hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize")
        self.optimizer = optimizer if wrapped else distributed_optimizer(optimizer, model, sync, counter=self.wire,
                                                                         seed=seed)
        self.precision = MixedPrecision(precision, self.device)  # autocast, loss scale, rank-consistent skip
        self.precision.attach(self.optimizer)
        if broadcast:  # an elastic job broadcasts in its state's first sync instead (hvdsync.torch.elastic)
            broadcast_state(self.model, self.optimizer)
        self.wire.reset()  # the optimizer-state broadcast is not gradient traffic

    def refresh(self) -> None:
        """Re-read rank and world size (they change when an elastic job resets)."""
        self.rank, self.size = hvd.rank(), hvd.size()

    @property
    def grad_tensors(self) -> int:
        return sum(1 for p in self.model.parameters() if p.requires_grad)

    def _to_device(self, value: Any) -> torch.Tensor:
        return torch.as_tensor(value).to(self.device, non_blocking=True)

    def train_step(self, micro, scale: float) -> float:
        self.optimizer.zero_grad()
        total = 0.0
        for x, y in micro:
            n = len(y)
            if n == 0:  # nothing to read on this rank in this micro-batch; the all-reduce below still joins in
                continue
            with self.timer.phase("compute", samples=n):
                x, y = self._to_device(x), self._to_device(y)
                with self.precision.autocast():
                    loss = self.loss(self.model(x), y)
                # The loss is the micro-batch's mean: times n it is the sum, times `scale` (hvdsync.core.train._scaling)
                # each sample weighs 1 / (samples in the global step). Backward passes *add* into .grad, so after
                # all micro-batches the gradient is the mean over the whole global step, also on a short last step.
                self.precision.backward(loss * (n * scale))
            total += float(loss.detach()) * n
        with self.timer.phase("sync_wait"):
            # Horovod started the all-reduce asynchronously from the last backward pass's hooks; wait for it here.
            # A rank that had fewer (or no) micro-batches submits its gradients (zeros where none) now.
            self.optimizer.synchronize()
        with self.timer.phase("update"):
            self.precision.step(self.optimizer)  # skipped on every rank if any rank's fp16 gradients overflowed
        return total

    def scale_learning_rate(self, factor: float) -> None:
        """Set every parameter group's learning rate to ``factor`` times its rate at the first call (the growing
        batch's rule, :class:`hvdsync.core.train.adaptive.GrowthLearningRate`)."""
        if not hasattr(self, "_base_lrs"):
            self._base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        for group, base in zip(self.optimizer.param_groups, self._base_lrs):
            group["lr"] = base * factor

    @torch.no_grad()
    def count_correct(self, x: np.ndarray, y: np.ndarray) -> int:
        self.model.eval()
        try:
            logits = self.model(self._to_device(x))
            return int((logits.argmax(dim=1).cpu() == torch.as_tensor(y)).sum())
        finally:
            self.model.train()

    def allgather(self, values: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.asarray(values, dtype=np.float64)).reshape(1, -1)
        return hvd.allgather(t, name="hvdsync.metrics").numpy().reshape((self.size,) + np.shape(values))

    def model_record(self, log_model: bool) -> ModelRecord:
        """The callback that records this model at the end of the run: its ``model_summary.txt`` and, with
        ``log_model`` (``tracking.log_model``), the model in MLflow's pytorch format (:func:`hvdsync.fitting.fit_loop`
        adds it)."""
        return _model_record(self.model, log_model)

    def parameters(self) -> list[np.ndarray]:
        return [p.detach().cpu().numpy() for p in self.model.parameters()]

    @torch.no_grad()
    def grad_norm(self) -> float:
        """L2 norm of the last step's (all-reduced) gradient, for the monitor."""
        grads = [p.grad.detach().double().norm() for p in self.model.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0


def build(cfg, data: datasets.Dataset, model: torch.nn.Module | None = None, loss: Loss | None = None,
          optimizer: torch.optim.Optimizer | None = None, broadcast: bool = True,
          timer: PhaseTimer | None = None) -> TorchBackend:
    """The backend for ``cfg``: ``model`` (default: the registered ``train.model`` sized for ``data``), its local
    optimizer (default: ``train.optimizer`` with the learning rate scaled per ``train.lr_scaling``), Horovod;
    ``broadcast`` rank 0's state now (an elastic job leaves that to its state's first sync); ``timer`` times the
    phases (default a new :class:`~hvdsync.core.telemetry.profiling.PhaseTimer`)."""
    model = model if model is not None else build_model(cfg, data, "torch")
    if optimizer is None:
        optimizer = local_optimizer(cfg, model, scaled_lr(cfg.train.lr, hvd.size(), cfg.train.lr_scaling))
    backend = TorchBackend(model, optimizer, cfg.sync, loss, cfg.train.precision, cfg.train.seed, broadcast=broadcast,
                           timer=timer)
    # The model was built from the global seed (identical start, then broadcast anyway); from here on torch's
    # generator draws per rank, so dropout masks and noise differ between ranks as they should (notebook 02).
    torch.manual_seed(seeding.rank_seed(cfg.train.seed, hvd.rank()))
    return backend


def _check_arguments(model, loss, train) -> None:
    # Plain argument checks, the same on every rank, so they fail before Horovod starts anything.
    if model is not None and loss is None:
        raise ValueError("loss: fit(model=...) with your own model needs loss=... (e.g. "
                         "torch.nn.CrossEntropyLoss()); only hvdsync's registered models come with a default loss")
    if model is None and train is not None:
        raise ValueError("model: fit(train=...) with your own data needs model=...; hvdsync's registered models "
                         "are sized from a registered data set (data.dataset)")
    if train is not None and not isinstance(train, (DataLoader, torch.utils.data.Dataset)):
        raise ValueError(f"train: {type(train).__name__} is not allowed; pass a torch Dataset, or a DataLoader "
                         "whose batch_sampler is hvdsync.torch.PlanSampler")


def fit(cfg=None, data: datasets.Dataset | None = None, before_step=None, *, model: torch.nn.Module | None = None,
        loss: Loss | None = None, optimizer: torch.optim.Optimizer | None = None, train=None, test=None,
        evaluate: Callable | None = None, callbacks: Sequence[Callback] = (), resume: PlanState | dict | None = None,
        num_workers: int = 0, timer: PhaseTimer | None = None) -> FitResult:
    """Initialise this PyTorch worker and train; returns this rank's :class:`~hvdsync.torch.FitResult`.

    With no model or data given it trains what ``cfg`` names (``train.model`` on ``data.dataset``, from
    :mod:`hvdsync.registry`; default: the MLP on digits). With your own pieces:

    Args:
        cfg: a :class:`~hvdsync.config.Config` (default ``Config()``): batch size, accumulation, epochs, sync, tracking.
        data: in-memory arrays (:class:`~hvdsync.core.train.data.Dataset`) instead of the registered data set.
        before_step: ``before_step(epoch, step)`` on every rank before each step.
        model: your ``nn.Module`` (then ``loss`` is required).
        loss: ``loss(outputs, targets)`` returning the batch *mean*, e.g. ``nn.CrossEntropyLoss(label_smoothing=0.1)``.
        optimizer: your *local* optimizer (default: ``train.optimizer`` at the scaled ``train.lr``).
        train: your ``torch.utils.data.Dataset`` (read through a :class:`PlanSampler` and a ``DataLoader`` with
            ``num_workers``), or your ``DataLoader`` built with ``batch_sampler=PlanSampler(...)``.
        test: a ``Dataset`` of ``(input, label)`` scored for ``test_accuracy`` after each epoch.
        evaluate: instead of ``test``, ``evaluate() -> {metric: (sum, count)}`` over this rank's share.
        callbacks: :class:`~hvdsync.core.train.callbacks.Callback` objects.
        resume: a plan position (``PlanSampler.state_dict()``, ``FitResult.plan_state``) to continue from.
        timer: a :class:`~hvdsync.core.telemetry.profiling.PhaseTimer` (subclass) to time the phases with, e.g. one
            that acts around each phase (default a new ``PhaseTimer``).

    Example:
        >>> fit(cfg, model=MyCNN(), loss=nn.CrossEntropyLoss(label_smoothing=0.1),      # doctest: +SKIP
        ...     train=my_train_set, test=my_test_set)
    """
    from hvdsync.config import Config  # here: hvdsync.config imports the core, not the adapters

    _check_arguments(model, loss, train)
    cfg = cfg or Config()
    init(cfg)
    if train is None:
        data = data if data is not None else datasets.load(cfg.data, cfg.train.seed)
        steps: Any = data  # fit_loop reads the arrays by the plan and scores their test split
    else:
        loader = train if isinstance(train, DataLoader) else DataLoader(
            train, batch_sampler=PlanSampler.from_config(cfg, train), num_workers=num_workers,
            pin_memory=torch.cuda.is_available())
        steps = LoaderSteps(loader)
    backend = build(cfg, data, model, loss, optimizer, timer=timer)
    if evaluate is None and test is not None:
        # Cut by the shares the loader's plan has in force (adaptive shares change them each epoch); arrays read
        # by fit_loop's own plan keep equal parts of the user's test set.
        shares = (lambda: steps.plan.shares) if train is not None else None
        evaluate = dataset_evaluator(backend.model, test, cfg.data.batch_size, shares=shares)
    resume = PlanState.from_dict(resume) if isinstance(resume, dict) else resume
    return fit_loop(cfg, backend, steps, evaluate, callbacks=[*callbacks, *make_callbacks(cfg)], resume=resume,
                    before_step=before_step)


def _model_record(model: torch.nn.Module, log_model: bool) -> ModelRecord:
    """The run's ``model_summary.txt`` and, with ``tracking.log_model``, the model in MLflow's pytorch format
    (:mod:`hvdsync.core.telemetry.modelrecord`)."""
    def rows() -> list[TensorRow]:
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        return [TensorRow(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size(),
                          id(t) in trainable) for name, t in model.state_dict(keep_vars=True).items()]

    def save(folder) -> None:
        import mlflow
        import mlflow.pytorch

        # Pickled, not MLflow's default pt2 (torch.export), which needs an input example to trace and fails on
        # models it cannot export; the requirements named, not inferred (MLflow would load the model in a new
        # process to find them).
        # A copy with fresh parameters: the trained ones carry the optimizer's gradient hooks (and through them
        # its Horovod handles and locks), which neither pickle nor belong in a saved model.
        fresh = {id(p): torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                 for p in model.parameters()}
        mlflow.pytorch.save_model(copy.deepcopy(model, fresh), str(folder), serialization_format="pickle",
                                  pip_requirements=[f"torch=={torch.__version__}", f"mlflow=={mlflow.__version__}"])

    return ModelRecord(type(model).__name__, rows, save if log_model else None)

