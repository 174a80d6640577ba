"""The config's sections (``sync``, ``data``, ``train``, ``tracking``, ``elastic``, ``monitor``), each a dataclass
that checks its own fields when built; checks that span sections live in :class:`hvdsync.config.loading.Config`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hvdsync.config.checks import (FRAMEWORKS, LR_SCALING, OPTIMIZERS, PRECISIONS, REDUCE_OPS, ConfigError, _bool,
                                   _choice, _fail, _import_plugins, _int, _number, _registered)
from hvdsync.core.comm.codecs import CODECS
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.train.gpus import DEVICES
from hvdsync.core.train._scaling import GROWTH_LR_RULES
from hvdsync.core.comm.schemes import MODES
from hvdsync.core.train.shares import SHARE_RULES, parse_growth
from hvdsync.core.comm.sparse import MODES as SPARSE_MODES


@dataclass
class SyncConfig:
    """How gradients are synchronised.

    Args:
        compression: codec for gradients on the wire, ``name`` or ``name:param``: ``none``, ``fp16``, ``bf16``,
            ``topk:<ratio>``, ``randk:<ratio>`` (ratio in (0, 1]), ``int8``, ``powersgd:<rank>`` (see
            :func:`hvdsync.torch.get_codec`). ``none`` and ``fp16`` are the cast codecs: the whole gradient, in
            another dtype, through Horovod's all-reduce. ``bf16`` sends as many bytes as ``fp16`` but is not one:
            Horovod cannot all-reduce bfloat16, so the values travel by allgather and each rank sums them in float32;
            with ``op: adasum`` or ``sparse: allgather`` only a cast codec goes.
        error_feedback: codecs that drop information (top-k, rand-k, int8, PowerSGD) keep what they did not send
            and add it to the next gradient; ``false`` drops it (to see what error feedback buys).
        momentum_correction: with ``topk``/``randk`` and error feedback, SGD's momentum moves from the optimizer into
            the codec (deep gradient compression's momentum correction and masking; :mod:`hvdsync.core.comm.codecs.sparse`):
            the residual then holds velocity, not gradient, and delayed values are not amplified by the momentum a
            second time. The optimizer's ``momentum`` (and, in PyTorch, its coupled ``weight_decay``) are set to 0
            and applied by the codec. No effect with other codecs or without momentum.
        accumulate: backward passes per optimizer step; gradients are all-reduced once per ``accumulate`` passes.
        op: how Horovod combines gradients: ``average`` (default), ``sum`` or ``adasum`` (Adasum combines whole
            gradients inside Horovod's all-reduce: with a cast codec only, ``compression`` none or fp16).
        fusion_threshold_mb: Horovod tensor-fusion buffer (HOROVOD_FUSION_THRESHOLD), in MiB.
        cycle_time_ms: Horovod background-loop cycle time (HOROVOD_CYCLE_TIME), in milliseconds.
        cache_capacity: Horovod response-cache entries (HOROVOD_CACHE_CAPACITY); 0 turns the cache off.
        grouped_mb: PyTorch: a model whose gradients total at most this many MiB is all-reduced in a few grouped
            Horovod calls, DDP's buckets (:mod:`hvdsync.torch.grouped`: the first up to 1 MiB, the others up to
            this size, each started when backward has produced its gradients) instead of one hook per tensor;
            larger models keep the hooks, whose all-reduces overlap the rest of backward. 25 like DDP's bucket
            (``bucket_cap_mb``); 0 = always the hooks. TensorFlow always reduces in one grouped call.
        mode: how ranks combine their work (:data:`hvdsync.core.comm.schemes.MODES`): ``allreduce`` (default; ring
            all-reduce of gradients), ``ps`` (parameter server from Horovod collectives), ``gossip`` (each rank
            averages its parameters with its ring neighbours), ``local_sgd`` (H local steps, then the parameters and
            optimizer state are averaged; :mod:`hvdsync.core.comm.schemes.local_sgd`).
        ps_servers: ``ps`` only: number of server ranks owning a shard each; 0 (default) = every rank.
        period: ``gossip`` and ``local_sgd``: average every ``period`` optimizer steps (1 = every step).
        warmup_steps: ``local_sgd`` only: all-reduce the gradients for the first ``warmup_steps`` steps, then go
            local (post-local SGD); 0 = local from the start.
        sparse: how sparse gradients (embedding tables: torch ``nn.Embedding(sparse=True)``, TensorFlow
            ``IndexedSlices``) are combined (:mod:`hvdsync.core.comm.sparse`): ``dense`` (default; densify and all-reduce,
            Horovod's ``sparse_as_dense``: works with every codec and mode) or ``allgather`` (only the touched rows
            and their indices travel; with ``compression`` none or fp16 and ``mode`` allreduce).
    """

    compression: str = "none"
    error_feedback: bool = True
    momentum_correction: bool = True
    accumulate: int = 1
    op: str = "average"
    # Measured with benchmarks/knobs.py on 2 local Gloo workers (docs/measurements/allreduce.md, "Choosing the
    # defaults"): fusion 16-128 MiB measure alike, 4 MiB or less slows many small gradients (0: 4-25x); a 1 ms cycle keeps a
    # step's sync latency low, shorter cycles burn more idle CPU and longer ones add latency; the cache must stay on
    # (0: ~3x the time of a small allreduce). An unpatched horovod.runner.run handed the workers cycle 0 and cache 0
    # instead of these two (scripts/horovod-patches/0003; docs/measurements/allreduce.md, "The launcher dropped two
    # knobs").
    fusion_threshold_mb: float = 64.0
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    # A small model's backward is over before a hook's all-reduce could hide behind it; what is left is Horovod's
    # cost per round (a cycle's wait, the negotiation, thread hand-offs), paid once per step instead of once per
    # group of hooks (docs/measurements/training.md, "The small CNN against DDP").
    grouped_mb: float = 25.0
    mode: str = "allreduce"
    ps_servers: int = 0
    period: int = 1
    warmup_steps: int = 0
    sparse: str = "dense"

    def __post_init__(self) -> None:
        _choice("sync.mode", self.mode, tuple(MODES))
        _int("sync.ps_servers", self.ps_servers, 0)
        _int("sync.period", self.period, 1)
        _int("sync.warmup_steps", self.warmup_steps, 0)
        try:
            codec = get_codec(self.compression)
        except ValueError as exc:
            raise ConfigError(f"sync.compression: {exc}") from None
        _bool("sync.error_feedback", self.error_feedback)
        _bool("sync.momentum_correction", self.momentum_correction)
        _int("sync.accumulate", self.accumulate, 1)
        _choice("sync.op", self.op, REDUCE_OPS)
        if self.op == "adasum" and not codec.cast:
            # Adasum combines whole gradients pairwise inside Horovod's all-reduce; pieces (top-k, PowerSGD) and
            # gathered values (int8, bf16) have no Adasum. The allowed ones are the cast codecs.
            _fail("sync.compression", self.compression, "with sync.op adasum (Adasum combines whole gradients in "
                  f"Horovod's all-reduce, which only a cast codec hands it) choose one of: {', '.join(cast_codecs())}"
                  f"; or keep {self.compression!r} with sync.op average or sum" + _BF16_NOTE.get(codec.name, ""))
        self._check_sparse(codec)
        _number("sync.fusion_threshold_mb", self.fusion_threshold_mb, 0.0)
        _number("sync.cycle_time_ms", self.cycle_time_ms, 0.0, low_open=True)
        _int("sync.cache_capacity", self.cache_capacity, 0)
        _number("sync.grouped_mb", self.grouped_mb, 0.0)

    def _check_sparse(self, codec) -> None:
        _choice("sync.sparse", self.sparse, SPARSE_MODES)
        if self.sparse != "allgather":
            return
        # Gathered rows are added, not reduced by a codec: a codec that reshapes gradients (top-k, PowerSGD, ...)
        # or Adasum's pairwise combination has nothing to work on, and the other sync modes reduce no gradients
        # through the all-reduce path. Densifying works with all of them.
        if not codec.cast:
            _fail("sync.sparse", self.sparse, f"with sync.compression {self.compression!r} choose dense (the codec "
                  "then compresses the densified gradient), or use allgather with a cast codec: compression "
                  f"{' or '.join(cast_codecs())}" + _BF16_NOTE.get(codec.name, ""))
        if self.op == "adasum":
            _fail("sync.sparse", self.sparse, "with sync.op adasum choose dense (Adasum has no sparse form)")
        if self.mode != "allreduce":
            _fail("sync.sparse", self.sparse, f"with sync.mode {self.mode!r} choose dense (allgather is for "
                  "gradients all-reduced by sync.mode allreduce)")

    def horovod_env(self) -> dict[str, str]:
        """The Horovod environment variables these knobs stand for (read by workers at ``hvd.init()``)."""
        return {
            "HOROVOD_FUSION_THRESHOLD": str(int(self.fusion_threshold_mb * 1024 * 1024)),
            "HOROVOD_CYCLE_TIME": f"{self.cycle_time_ms:g}",
            "HOROVOD_CACHE_CAPACITY": str(self.cache_capacity),
        }


@dataclass
class DataConfig:
    """What the workers read.

    Args:
        dataset: a registered data set (:mod:`hvdsync.registry`): ``digits`` (scikit-learn's bundled 8x8
            handwritten digits), ``digits_images`` (the same as 8x8x1 images), ``synthetic`` (Gaussian clusters made
            by seed), ``synthetic_images`` (textures of any size made by seed), or one you registered.
        batch_size: samples per rank per optimizer step (split into ``sync.accumulate`` micro-batches).
        test_fraction: share of the data held out for the test accuracy.
        shuffle: reshuffle the global order each epoch (seeded; identical on every rank).
        synthetic_samples / synthetic_features / synthetic_classes: shape of the synthetic sets.
        synthetic_spread: standard deviation of the ``synthetic`` class centres, against noise of 1: smaller is
            harder (1.5: nearly separable; 0.12: the wide MLP reaches ~80 % in 48 steps of 64).
        image_size / image_channels: height (= width) and channels of ``synthetic_images``.
        shares: how each global step is divided among the ranks: ``equal`` (sizes differ by at most one) or
            ``adaptive`` (at every epoch boundary, by each rank's measured throughput, all-gathered: a slow rank
            reads fewer samples; :mod:`hvdsync.core.train.shares`).
        batch_growth: ``{epoch: factor}``: from ``epoch`` on the batch is ``factor`` x ``batch_size`` (fewer
            all-reduces per epoch); the learning rate follows ``train.growth_lr``. Empty: a constant batch.
    """

    dataset: str = "digits"
    batch_size: int = 32
    test_fraction: float = 0.25
    shuffle: bool = True
    synthetic_samples: int = 4096
    synthetic_features: int = 64
    synthetic_classes: int = 10
    synthetic_spread: float = 1.5
    image_size: int = 16
    image_channels: int = 3
    shares: str = "equal"
    batch_growth: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from hvdsync.registry import DATASETS

        _registered(DATASETS, "data.dataset", self.dataset)
        _int("data.batch_size", self.batch_size, 1)
        _number("data.test_fraction", self.test_fraction, 0.0, 1.0, low_open=True)
        _bool("data.shuffle", self.shuffle)
        _int("data.synthetic_samples", self.synthetic_samples, 2)
        _int("data.synthetic_features", self.synthetic_features, 1)
        _int("data.synthetic_classes", self.synthetic_classes, 2)
        _number("data.synthetic_spread", self.synthetic_spread, 0.0, low_open=True)
        _int("data.image_size", self.image_size, 1)
        _int("data.image_channels", self.image_channels, 1)
        _choice("data.shares", self.shares, SHARE_RULES)
        if not isinstance(self.batch_growth, dict):
            _fail("data.batch_growth", self.batch_growth,
                  "expected a mapping of epoch to batch factor, e.g. {2: 2, 4: 4}")
        try:
            self.batch_growth = dict(parse_growth("data.batch_growth", self.batch_growth))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass
class TrainConfig:
    """The training run.

    Args:
        framework: ``torch`` or ``tensorflow``.
        model: a model registered for ``framework`` (:mod:`hvdsync.registry`): ``mlp``, ``cnn`` (a small
            ResNet-style network for image data sets), or one you registered.
        plugins: modules to import first (in the launcher and in every worker) that register models, data sets or
            callbacks.
        callbacks: callbacks registered by name (:func:`hvdsync.registry.register_callback`, in a plugin module)
            that hvdsync's training loop runs in every worker, elastic runs included: user code that observes or
            acts on each step and epoch (:class:`hvdsync.torch.Callback`). Keras ``fit`` takes Keras
            callbacks instead.
        np: number of Horovod worker processes the launcher starts.
        epochs: passes over the training set.
        lr: learning rate for the global batch (see ``lr_scaling``).
        lr_scaling: ``none`` keeps ``lr``; ``linear`` multiplies it by the number of workers (the usual rule when
            the global batch grows with the workers).
        growth_lr: how the learning rate follows ``data.batch_growth``'s factor f: ``sqrt`` (x sqrt(f)),
            ``linear`` (x f) or ``none`` (:func:`hvdsync.torch.grown_lr`).
        optimizer: ``sgd`` (with ``momentum``) or ``adam``.
        momentum: SGD's momentum (with ``optimizer: sgd``; ``adam`` does not use it).
        hidden: width of the MLP's hidden layer (the CNN's channels: a multiple of 4).
        seed: the one global seed; per-rank seeds are derived from it.
        deterministic: ask the framework for deterministic kernels (slower; bit-reproducible runs).
        precision: ``fp32``; ``fp16`` (autocast / Keras ``mixed_float16`` with dynamic loss scaling; a step whose
            gradients overflow on any rank is skipped on every rank) or ``bf16`` (float32's range: no loss scale).
        device: where each worker trains: ``auto`` (one GPU per rank where the framework can use one, else the
            CPU), ``cpu`` (no GPU is touched even where one is present) or ``cuda`` (a GPU per rank is required:
            ``init`` stops with one line naming why there is none; :mod:`hvdsync.core.train.gpus`).
        keep_freed_memory: each worker's C allocator (glibc's malloc) keeps the memory a step frees for the next
            step instead of handing it back to the system, so a gradient-sized buffer is not faulted in page by
            page again every step (:func:`hvdsync.core.train.runtime.keep_freed_memory`). ``false`` leaves the
            allocator as it was; an allocator chosen in the environment (``MALLOC_*`` settings, a preloaded
            jemalloc or tcmalloc) is always left alone.
    """

    framework: str = "torch"
    model: str = "mlp"
    plugins: list = field(default_factory=list)
    callbacks: list = field(default_factory=list)
    np: int = 2
    epochs: int = 10
    lr: float = 0.1
    lr_scaling: str = "none"
    growth_lr: str = "sqrt"
    optimizer: str = "sgd"
    momentum: float = 0.9
    hidden: int = 64
    seed: int = 0
    deterministic: bool = False
    precision: str = "fp32"
    device: str = "auto"
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        _choice("train.framework", self.framework, FRAMEWORKS)
        _choice("train.device", self.device, DEVICES)
        _choice("train.precision", self.precision, PRECISIONS)
        _import_plugins("train.plugins", self.plugins)
        from hvdsync.registry import CALLBACKS, MODELS

        _registered(MODELS, "train.model", self.model, self.framework)
        if not isinstance(self.callbacks, list):
            _fail("train.callbacks", self.callbacks, "expected a list of registered callback names")
        for name in self.callbacks:
            _registered(CALLBACKS, "train.callbacks", name)
        _int("train.np", self.np, 1, 64)
        _int("train.epochs", self.epochs, 1)
        _number("train.lr", self.lr, 0.0, low_open=True)
        _choice("train.lr_scaling", self.lr_scaling, LR_SCALING)
        _choice("train.growth_lr", self.growth_lr, GROWTH_LR_RULES)
        _choice("train.optimizer", self.optimizer, OPTIMIZERS)
        _number("train.momentum", self.momentum, 0.0, 1.0)
        _int("train.hidden", self.hidden, 1)
        _int("train.seed", self.seed, 0, 2**32 - 1)
        _bool("train.deterministic", self.deterministic)
        _bool("train.keep_freed_memory", self.keep_freed_memory)


@dataclass
class TrackingConfig:
    """MLflow run tracking (rank 0 writes; a tracking failure never stops training).

    Args:
        enabled: record the run in MLflow.
        tracking_uri: MLflow tracking URI; empty means MLflow's own default (``MLFLOW_TRACKING_URI`` or a local
            ``mlflow.db``).
        experiment: MLflow experiment name.
        run_name: MLflow run name; empty: named for what ran (framework, ranks, hosts, codec, mode, accumulation).
        spool_dir: where every record is written before it is sent (empty: ``$HVDSYNC_CACHE/spool``, i.e.
            ``~/.cache/hvdsync/spool``); what a dead store did not get stays there for ``hvdsync runs push``.
        parent_run_id: record the run as a child of this MLflow run (what ``hvdsync sweep`` sets).
        system_metrics: record CPU, memory, disk, network and GPU use of every node (``system/<node>/...``).
        timeline: capture Horovod's timeline (``HOROVOD_TIMELINE``) and record it with a per-tensor chart.
        flush_seconds: at the end, how long to wait for the store to take what is still queued (a dead store
            answers at once; the rest stays in the spool).
        log_model: at the end of a finished run, save the model in MLflow's model format (``mlflow.pytorch``,
            ``mlflow.keras``) under the run's ``model/`` artifacts. Off by default: rank 0 serialises the whole
            model while the other ranks wait, and the store keeps another copy of it for every run and every sweep
            child (gigabytes for a big model); the checkpoints keep the weights already. ``model_summary.txt``
            (each tensor's shape, dtype and bytes, the parameter count) is recorded in any case.
    """

    enabled: bool = True
    tracking_uri: str = ""
    experiment: str = "hvdsync"
    run_name: str = ""
    spool_dir: str = ""
    parent_run_id: str = ""
    system_metrics: bool = True
    timeline: bool = False
    flush_seconds: float = 30.0
    log_model: bool = False

    def __post_init__(self) -> None:
        _bool("tracking.enabled", self.enabled)
        _bool("tracking.log_model", self.log_model)
        _bool("tracking.system_metrics", self.system_metrics)
        _bool("tracking.timeline", self.timeline)
        _number("tracking.flush_seconds", self.flush_seconds, 0.0)
        for name in ("tracking_uri", "experiment", "run_name", "spool_dir", "parent_run_id"):
            if not isinstance(getattr(self, name), str):
                _fail(f"tracking.{name}", getattr(self, name), "expected a string")
        if not self.experiment:
            _fail("tracking.experiment", self.experiment, "expected a non-empty name")


@dataclass
class ElasticConfig:
    """Elastic training: survive lost workers, grow when hosts come back, resume a lost job from disk.

    Args:
        enabled: run under Horovod's elastic driver (``hvdsync train --elastic``).
        min_np / max_np: the job continues while at least ``min_np`` workers are alive and grows up to ``max_np``;
            it starts with ``train.np``.
        commit_every: commit the state in memory every this many optimizer steps (what a lost worker costs at most).
        checkpoint_dir: folder for durable checkpoints (rank 0 writes); empty: none.
        checkpoint_every: write a durable checkpoint every this many commits.
        keep: durable checkpoints kept (the newest valid one is resumed from).
        resume: start from the newest valid checkpoint in ``checkpoint_dir`` (fresh, and saying so, if none).
        timeout_s: how long the driver waits for ``min_np`` workers after a reset before it ends the job
            (Horovod's elastic timeout).
        cooldown_min_s / cooldown_max_s: a failed host is excluded for a cooldown drawn between these and then
            may rejoin (Horovod's blacklist cooldown range); ``cooldown_min_s: 0`` excludes it for the whole job.
    """

    enabled: bool = False
    min_np: int = 1
    max_np: int = 3
    commit_every: int = 10
    checkpoint_dir: str = ""
    checkpoint_every: int = 1
    keep: int = 3
    resume: bool = False
    timeout_s: int = 60
    cooldown_min_s: int = 0
    cooldown_max_s: int = 60

    def __post_init__(self) -> None:
        _bool("elastic.enabled", self.enabled)
        _int("elastic.min_np", self.min_np, 1, 64)
        _int("elastic.max_np", self.max_np, 1, 64)
        if self.max_np < self.min_np:
            _fail("elastic.max_np", self.max_np, f"expected at least elastic.min_np ({self.min_np})")
        _int("elastic.commit_every", self.commit_every, 1)
        if not isinstance(self.checkpoint_dir, str):
            _fail("elastic.checkpoint_dir", self.checkpoint_dir, "expected a folder path (a string)")
        _int("elastic.checkpoint_every", self.checkpoint_every, 1)
        _int("elastic.keep", self.keep, 1)
        _bool("elastic.resume", self.resume)
        if self.resume and not self.checkpoint_dir:
            _fail("elastic.resume", self.resume, "resuming needs elastic.checkpoint_dir")
        _int("elastic.timeout_s", self.timeout_s, 1)
        _int("elastic.cooldown_min_s", self.cooldown_min_s, 0, 3600)
        _int("elastic.cooldown_max_s", self.cooldown_max_s, max(1, self.cooldown_min_s), 3600)


@dataclass
class MonitorConfig:
    """Cross-rank checks every ``every`` steps (one small all-gather; see :mod:`hvdsync.core.telemetry.observe`).

    Args:
        every: steps between checks; also the interval of per-step and per-rank metrics. 0 turns both off.
        straggler_ratio: a rank whose working time per step (its step time minus its wait in the all-reduce) is
            more than this times the median of the other ranks' is named a straggler.
        divergence_tolerance: largest allowed difference between ranks' parameter fingerprints (0: bitwise equal,
            what synchronous training guarantees).
    """

    every: int = 10
    straggler_ratio: float = 3.0
    divergence_tolerance: float = 0.0

    def __post_init__(self) -> None:
        _int("monitor.every", self.every, 0)
        _number("monitor.straggler_ratio", self.straggler_ratio, 1.0, low_open=True)
        _number("monitor.divergence_tolerance", self.divergence_tolerance, 0.0)


# bf16 is the one codec that sends a gradient whole in 16 bits and still is not a cast codec: said where it is refused.
_BF16_NOTE = {"bf16": " (bf16 is not a cast codec: Horovod cannot all-reduce bfloat16, so its values travel by "
                      "allgather and each rank sums them)"}


def cast_codecs() -> list[str]:
    """The registered codecs (those without a parameter) that are cast codecs: the gradient whole, in another dtype,
    through Horovod's all-reduce (``none``, ``fp16`` and a user's own). What Adasum and sparse allgather take."""
    return [name for name, entry in CODECS.items() if entry.param is None and _is_cast(entry)]


def _is_cast(entry) -> bool:
    """Whether a registered codec (one without a parameter) is a cast codec, the kind Adasum can carry."""
    try:
        return bool(entry.make().cast)
    except Exception:  # noqa: BLE001 - a user's codec that cannot be built bare is not offered
        return False
