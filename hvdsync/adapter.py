"""The contract both framework adapters keep, and the one place where a script's keyword shortcuts become settings.

``import hvdsync.torch as hs`` and ``import hvdsync.tensorflow as hs`` offer the same module files (:data:`MODULES`),
the same public names and the same signatures: :class:`Adapter` writes them down (parameter names, kinds, order and
defaults; the types are each framework's own). ``tests/unit/test_adapter_protocol.py`` holds both adapters to it
and names, each with its reason, what exists in one framework only.

The settings reach an adapter already checked: a :class:`~hvdsync.config.SyncConfig` checks every field when it is
built (from the CLI, a YAML file or ``Config.from_dict``), and the adapters' builders take it as it is, together with
the codec built once from it (`get_codec`, in both adapters). A script of your own may pass keyword
shortcuts instead (``distributed_optimizer(opt, compression="fp16", accumulate=4)``): :func:`sync_settings` turns
them into a checked ``SyncConfig``, for both frameworks alike.
"""
from __future__ import annotations

import dataclasses
import textwrap
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from hvdsync.config import ConfigError, SyncConfig
from hvdsync.core.telemetry.observe import prepare_timeline
from hvdsync.core.train import seeding
from hvdsync.core.train.runtime import (REDUCE_OP_NAMES, WorkerInfo, apply_horovod_env, keep_freed_memory,
                                        report_knobs)

if TYPE_CHECKING:
    from hvdsync.core.comm.codecs import WireCounter
    from hvdsync.core.comm.codecs.base import Codec
    from hvdsync.core.elastic.loop import ElasticResult
    from hvdsync.core.elastic.state import ElasticState
    from hvdsync.core.train.data import Dataset
    from hvdsync.core.train._context import FitResult
    from hvdsync.core.train.runtime import WorkerInfo

# The core's names a user's own loop or Keras script needs, by the core module that defines them. Both adapters
# export each (the same object: ``hvdsync.torch.ShardPlan is hvdsync.tensorflow.ShardPlan``), so that a user's
# script imports its adapter, not hvdsync.core, whose modules may move (0.2.0's reorganisation broke such imports).
# The defining modules are private; the core paths documented until 0.3.0 (hvdsync.core.train.sharding, ...) forward
# these names with a DeprecationWarning naming the adapter until 0.4.0 (docs/api.md, "Old paths").
FROM_THE_CORE = {
    "hvdsync.core.train._context": ("TrainContext", "FitResult"),
    "hvdsync.core.train._plan": ("ShardPlan", "Step", "PlanState"),
    "hvdsync.core.train._scaling": ("loss_scale", "scaled_lr", "warmup_lr", "grown_lr"),
    "hvdsync.core.comm.codecs.registry": ("get_codec",),
    "hvdsync.core.comm.codecs.base": ("Codec",),
    "hvdsync.core.comm.codecs.state": ("CodecState",),
    "hvdsync.core.telemetry._spread": ("StepSpread",),
    "hvdsync.core.elastic._ledger": ("SampleLedger",),
    "hvdsync.core.elastic._store": ("CheckpointStore",),
}

# The module files of every adapter (paths under hvdsync/<framework>/).
MODULES = ("__init__.py", "compression.py", "data.py", "elastic.py", "evaluate.py", "layers.py", "models.py",
           "optimizer.py", "precision.py", "runtime.py", "schemes/__init__.py", "schemes/base.py",
           "schemes/gossip.py", "schemes/local_sgd.py", "schemes/ps.py", "sparse.py", "train.py")


class Adapter(Protocol):
    """What ``hvdsync.torch`` and ``hvdsync.tensorflow`` both export, with the signatures both keep.

    ``self`` aside, each member's parameters are the adapter's; a member named like a class stands for that class's
    constructor. The model, tensor and optimizer types are the framework's own.
    """

    # ---- a worker and the shared loop ------------------------------------------------------------------------
    def init(self, cfg=None) -> WorkerInfo:
        """Start Horovod in this worker with ``cfg``'s knobs, pin the device, set the threads."""

    def fit(self, cfg=None, data: Dataset | None = None, before_step: Callable[[int, int], None] | None = None, *,
            model=None, loss=None, optimizer=None, train=None, test=None, evaluate: Callable | None = None,
            callbacks: Sequence = (), resume=None, num_workers: int = 0, timer=None) -> FitResult:
        """Initialise this worker and train with the shared loop (an argument a framework cannot honour raises an
        error naming it and what to use instead)."""

    def build(self, cfg, data: Dataset, model=None, loss=None, optimizer=None, broadcast: bool = True,
              timer=None) -> Any:
        """The backend the shared loop drives (the user's pieces or the registered ones)."""

    def Callback(self) -> Any:
        """The shared loop's callback (:class:`hvdsync.core.train.callbacks.Callback`), the same class in both."""

    def check_same_model(self, model) -> None:
        """Fail on every rank when the ranks built different models."""

    def dataset_evaluator(self, model, dataset, batch_size: int = 256,
                          shares: Callable[[], Sequence[float] | None] | None = None) -> Callable[[], dict]:
        """``evaluate()`` for the shared loop: accuracy on a test set of the user's, each rank its share."""

    # ---- gradients -------------------------------------------------------------------------------------------
    def distributed_optimizer(self, optimizer, model=None, sync: SyncConfig | None = None, *,
                              compression: str | None = None, accumulate: int | None = None, op=None,
                              sparse: str | None = None, counter: WireCounter | None = None, seed: int = 0) -> Any:
        """The local optimizer wrapped so that gradients are combined across ranks (the accumulation rule in
        :data:`ACCUMULATION_RULE`)."""

    def broadcast_state(self, model, optimizer=None, root_rank: int = 0) -> None:
        """Rank ``root_rank``'s model and optimizer state to every rank."""

    def CodecCompressor(self, codec: Codec | str, counter: WireCounter | None = None) -> Any:
        """Horovod's ``compression=`` hook for the cast codecs (``none``, ``fp16``; not ``bf16``, which travels by
        allgather)."""

    # ---- data ------------------------------------------------------------------------------------------------
    def PlanSampler(self, dataset, batch_size: int, accumulate: int = 1, seed: int = 0, shuffle: bool = True,
                    rank: int | None = None, world_size: int | None = None, op: str = "average",
                    growth=()) -> Any:
        """This rank's share of the global plan, for the framework's own data pipeline."""

    def ShardedLoader(self, x, y, plan, rank: int) -> Any:
        """This rank's planned steps over in-memory arrays."""

    # ---- models ----------------------------------------------------------------------------------------------
    def mlp(self, n_features: int, hidden: int, n_classes: int) -> Any:
        """A one-hidden-layer perceptron returning logits."""

    def CNN(self, n_classes: int, width: int = 16, blocks: int = 2) -> Any:
        """A small ResNet-style network for images returning logits."""

    def SyncBatchNormalization(self, *args: Any, **kwargs: Any) -> Any:
        """Batch normalisation with the statistics of all ranks' samples (the framework's own layer's arguments)."""

    def local_optimizer(self, cfg, model, lr: float) -> Any:
        """``train.optimizer`` over the model's parameters at ``lr``."""

    # ---- elastic ---------------------------------------------------------------------------------------------
    def elastic_state(self, model, optimizer, cfg=None, codec: Any = None,
                      on_event: Callable[[dict], None] | None = None, **user: Any) -> ElasticState:
        """The elastic state: model, optimizer, plan position and the user's objects, committed and restored."""

    def run_elastic(self, func: Callable, state: ElasticState) -> Any:
        """Run ``func(state)`` elastically (a lost or added worker resets and resumes from the last commit)."""

    def fit_elastic(self, cfg=None, data: Dataset | None = None, record_reads: bool = False, *,
                    callbacks: Sequence = ()) -> ElasticResult:
        """hvdsync's built-in model trained elastically, with ``callbacks`` in its loop (e.g.
        :class:`~hvdsync.torch.SampleLedger`). ``record_reads=True`` is deprecated: it adds a
        ``SampleLedger``."""


# Shown in both adapters' ``distributed_optimizer`` docstrings (:func:`states_the_accumulation_rule`): written once.
ACCUMULATION_RULE = """\
The accumulation rule, the same in both frameworks: the optimizer applies the SUM of the ``accumulate`` backward
passes' gradients, combined across ranks by ``op``. In a loop of your own, each pass's loss is its micro-batch's
summed loss (the batch mean times the micro-batch's size) times
:func:`~hvdsync.torch.loss_scale` of the global step, whose sample count covers every pass; the
update is then the gradient of the mean loss over the global step. Keras' ``compile``/``fit`` feeds batch-mean
losses instead: there TensorFlow's optimizer divides each by ``accumulate`` in its ``scale_loss``, the one place
that applies Keras' averaging."""



def start_horovod(hvd, cfg) -> WorkerInfo:
    """What both adapters' ``init`` do around ``hvd.init()`` (``hvd``: ``horovod.torch`` or
    ``horovod.tensorflow``), in the order Horovod needs: the deterministic environment, ``HOROVOD_TIMELINE`` and
    Horovod's knobs from ``cfg.sync`` are read by ``hvd.init``, so they are set before it (a knob the environment
    sets wins: :func:`~hvdsync.core.train.runtime.apply_horovod_env`); the knobs that applied are reported on rank 0.
    ``train.keep_freed_memory`` sets the allocator before any model or gradient is allocated."""
    if cfg.train.keep_freed_memory:
        keep_freed_memory()
    if cfg.train.deterministic:
        seeding.apply_deterministic_env()
    prepare_timeline(cfg.tracking.timeline, cfg.tracking.spool_dir)
    knobs = apply_horovod_env(cfg.sync, initialized=hvd.is_initialized())
    hvd.init()
    report_knobs(knobs, hvd.rank())
    return WorkerInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def states_the_accumulation_rule(fn: Callable) -> Callable:
    """Put :data:`ACCUMULATION_RULE` where ``fn``'s docstring says ``{accumulation_rule}``: the rule is written once
    and ``help()`` shows it in both frameworks' ``distributed_optimizer``."""
    fn.__doc__ = fn.__doc__.replace("{accumulation_rule}", textwrap.indent(ACCUMULATION_RULE, "    ").lstrip())
    return fn


def sync_settings(sync: SyncConfig | None = None, *, compression=None, accumulate: int | None = None, op=None,
                  sparse: str | None = None, horovod: Any = None) -> SyncConfig:
    """The checked settings an adapter's ``distributed_optimizer`` builds from: ``sync`` as it is (checked when it
    was built) when no keyword is given, else ``sync`` (default: hvdsync's defaults) with the given keywords, checked
    here like the config, so a bad value fails with the field's name. One helper for both frameworks.

    Args:
        sync: a :class:`~hvdsync.config.SyncConfig`, e.g. ``cfg.sync``.
        compression, accumulate, op, sparse: the shortcuts of a script of your own; they win over ``sync``.
        horovod: the framework's Horovod module, whose own constants are accepted too (``op=hvd.Average``,
            ``compression=hvd.Compression.fp16``).

    Example:
        >>> sync_settings(compression="fp16", accumulate=4).accumulate
        4
    """
    if sync is not None and not isinstance(sync, SyncConfig):
        raise ConfigError(f"sync: a {type(sync).__name__} is not allowed; expected a SyncConfig (e.g. cfg.sync)")
    if horovod is not None and op is not None and not isinstance(op, str):
        op = next((name for name, attr in REDUCE_OP_NAMES.items() if getattr(horovod, attr, None) == op), op)
    if horovod is not None and compression is not None and not isinstance(compression, str):
        named = {horovod.Compression.none: "none", horovod.Compression.fp16: "fp16"}
        compression = named.get(compression, compression)
    given = {k: v for k, v in (("compression", compression), ("accumulate", accumulate), ("op", op),
                               ("sparse", sparse)) if v is not None}
    if not given:
        return sync if sync is not None else SyncConfig()
    return dataclasses.replace(sync, **given) if sync is not None else SyncConfig(**given)
