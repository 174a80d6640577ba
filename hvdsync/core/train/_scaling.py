"""The one place where the loss is scaled for data parallelism and gradient accumulation.

Both adapters compute, for each micro-batch, the *sum* of per-sample losses and multiply it by
:func:`loss_scale`. Then the gradients that Horovod combines equal the gradient of the mean loss over the whole
global step (all ranks, all micro-batches), exactly as one process would compute it on the same samples:

    mean loss over the global step = (1 / G) * sum over ranks r, micro-batches m of sum(loss(r, m))

* Accumulation: the k micro-batch gradients are *added* locally (backward passes accumulate into ``.grad``), so
  each micro-batch's loss is divided by the global count G, not by its own size. Dividing by the micro-batch size
  (the common bug) would make k micro-batches weigh k times one batch of the same samples. Both frameworks'
  distributed optimizers apply that sum (the rule in ``hvdsync.adapter.ACCUMULATION_RULE``); only Keras'
  ``fit``, which feeds batch-mean losses, has them divided by k, in TensorFlow's ``DistributedOptimizer.scale_loss``.
* Uneven shares: on the last step ranks may hold different numbers of samples; scaling by the rank's *share* of G
  (rather than taking each rank's own mean) keeps every sample's weight 1/G.
* Horovod's ``average`` divides the sum over ranks by the world size W, so the scale is multiplied by W to undo it;
  ``sum`` needs no correction. ``adasum`` combines gradients adaptively (not linearly), so it gets the same scale
  as ``average``: each rank hands over its own mean-scaled gradient.
"""
# Private home of loss_scale and the learning-rate rules: their public names are the adapters' (hvdsync.torch.X, hvdsync.tensorflow.X), and
# hvdsync.core.train.scaling (the path documented before 0.3.0) forwards them with a DeprecationWarning until 0.4.0. hvdsync
# imports them from here so that it never warns; a private name, not a new public module, so the core gets no
# second documented path for them.
from __future__ import annotations


def loss_scale(global_count: int, world_size: int, op: str) -> float:
    """Factor for a micro-batch's summed loss so that the combined gradient is the global-step mean.

    Args:
        global_count: samples in the optimizer step over all ranks and micro-batches.
        world_size: number of ranks.
        op: Horovod reduce op: ``average``, ``sum`` or ``adasum``.

    Example:
        >>> loss_scale(global_count=64, world_size=2, op="average")  # 2 ranks x 32 samples
        0.03125
    """
    if global_count <= 0:
        raise ValueError(f"global_count: {global_count!r} is not allowed; expected a positive sample count")
    if op == "sum":
        return 1.0 / global_count
    if op in ("average", "adasum"):
        return world_size / global_count
    raise ValueError(f"op: {op!r} is not allowed; choose one of: average, sum, adasum")


def scaled_lr(lr: float, world_size: int, rule: str) -> float:
    """The learning rate for ``world_size`` workers: ``none`` keeps it, ``linear`` multiplies by the world size."""
    if rule == "none":
        return lr
    if rule == "linear":
        return lr * world_size
    raise ValueError(f"lr_scaling: {rule!r} is not allowed; choose one of: none, linear")


GROWTH_LR_RULES = ("none", "linear", "sqrt")


def grown_lr(lr: float, factor: float, rule: str) -> float:
    """The learning rate when the global batch is ``factor`` times its starting size.

    ``linear`` (Goyal et al. 2017: the same number of epochs of SGD see the same total step length) multiplies by
    ``factor``; ``sqrt`` (Krizhevsky 2014; Hoffer et al. 2017: keeps the gradient noise's variance per step) by its
    square root, the safer rule for adaptive optimizers and large factors; ``none`` keeps ``lr`` (Smith et al.
    2018 grow the batch *instead of* decaying the rate: a larger batch then acts like a smaller rate).

    Example:
        >>> [grown_lr(0.1, 4, r) for r in ("none", "linear", "sqrt")]
        [0.1, 0.4, 0.2]
    """
    if factor <= 0:
        raise ValueError(f"factor: {factor!r} is not allowed; expected a number > 0")
    if rule == "none":
        return lr
    if rule == "linear":
        return lr * factor
    if rule == "sqrt":
        return lr * factor ** 0.5
    raise ValueError(f"lr rule: {rule!r} is not allowed; choose one of: {', '.join(GROWTH_LR_RULES)}")


def warmup_lr(target_lr: float, world_size: int, epoch: float, warmup_epochs: float) -> float:
    """Goyal et al.'s gradual warm-up for large global batches: the learning rate at (fractional) ``epoch``.

    It starts at the one-worker rate ``target_lr / world_size`` and rises linearly to ``target_lr`` (the rate scaled
    for ``world_size`` workers) at ``epoch == warmup_epochs``, then stays there. A large batch's scaled rate applied
    from the first step diverges while the weights change fast; the ramp avoids that ("Accurate, Large Minibatch
    SGD", 2017, section 2.2). Horovod's ``LearningRateWarmupCallback`` uses the same ramp.

    Args:
        target_lr: the rate after the warm-up.
        world_size: number of ranks (1: no warm-up needed, the rate is ``target_lr`` throughout).
        epoch: epochs done so far, with the fraction of the current one (``epoch + batch / steps_per_epoch``).
        warmup_epochs: length of the ramp; 0 switches it off.

    Example:
        >>> [warmup_lr(0.8, 4, e, 2) for e in (0, 1, 2, 3)]
        [0.2, 0.5, 0.8, 0.8]
    """
    if warmup_epochs < 0:
        raise ValueError(f"warmup_epochs: {warmup_epochs!r} is not allowed; expected a number >= 0")
    if world_size < 1:
        raise ValueError(f"world_size: {world_size!r} is not allowed; expected an integer >= 1")
    if warmup_epochs == 0 or epoch >= warmup_epochs:
        return target_lr
    start = target_lr / world_size
    return start + (target_lr - start) * max(0.0, epoch) / warmup_epochs
