"""Mixed precision for TensorFlow/Keras 3 on Horovod: a Keras dtype policy (``mixed_float16`` /
``mixed_bfloat16``) and, for fp16, Keras' ``LossScaleOptimizer`` with the skip decided by all ranks.

Keras' ``LossScaleOptimizer`` unscales the gradients, checks them for inf/nan (``check_finite``) and either applies
them and maybe doubles the scale, or skips the update and halves the scale. It checks this rank's gradients only;
:class:`RankConsistentLossScaleOptimizer` all-reduces the answer, so that every rank skips, and halves its scale,
when any rank overflowed. Mirrors ``hvdsync/torch/precision.py``.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.core.train.precision import policy

_KERAS_POLICIES = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}


class RankConsistentLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """``keras.optimizers.LossScaleOptimizer`` whose finite check is all-reduced (any rank non-finite: all skip).

    Args:
        inner_optimizer: the local Keras optimizer.
        **kwargs: ``initial_scale``, ``dynamic_growth_steps`` (Keras' own).
    """

    def __init__(self, inner_optimizer, **kwargs) -> None:
        super().__init__(inner_optimizer, **kwargs)
        # A plain tf.Variable (not an optimizer variable): not broadcast, not saved; counted inside the traced update.
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdsync_skipped_steps")

    def check_finite(self, grads):
        local = super().check_finite(grads)
        bad = hvd.allreduce(tf.reshape(tf.cast(tf.logical_not(local), tf.float32), [1]), op=hvd.Max,
                            name="hvdsync.precision.overflow")
        finite = tf.equal(bad[0], 0.0)
        self.skipped.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        return finite


class MixedPrecision:
    """The Keras dtype policy and loss scaling for one model (the TensorFlow side of ``train.precision``).

    Create it *before* building the model (the policy applies to layers built afterwards), then wrap the local
    optimizer with :meth:`wrap` and scale each backward pass's loss with :meth:`scale_loss`.

    Example:
        >>> mp = MixedPrecision("fp16")                              # doctest: +SKIP
        >>> model = build_model(); opt = mp.wrap(keras.optimizers.SGD(0.1))   # doctest: +SKIP
    """

    def __init__(self, precision: str) -> None:
        self.policy = policy(precision)
        keras.config.set_dtype_policy(_KERAS_POLICIES[precision])
        self.optimizer: RankConsistentLossScaleOptimizer | None = None

    def wrap(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """The local optimizer, inside a :class:`RankConsistentLossScaleOptimizer` under fp16."""
        if self.policy.loss_scaling:
            self.optimizer = RankConsistentLossScaleOptimizer(optimizer)
            return self.optimizer
        return optimizer

    def attach(self, optimizer) -> None:
        """Hand a distributed optimizer's codec reducer the loss scale, so that the codec skips overflowed steps
        and keeps its error-feedback residuals in the units of the real gradient."""
        reducer = getattr(optimizer, "reducer", None)
        if self.optimizer is not None and hasattr(reducer, "loss_scale"):
            reducer.loss_scale = lambda: tf.cast(self.optimizer.dynamic_scale, tf.float32)

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        return self.optimizer.scale_loss(loss) if self.optimizer is not None else loss

    @property
    def scale(self) -> float:
        return float(self.optimizer.dynamic_scale.numpy()) if self.optimizer is not None else 1.0

    @property
    def skipped_steps(self) -> int:
        return int(self.optimizer.skipped.numpy()) if self.optimizer is not None else 0
