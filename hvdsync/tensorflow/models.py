"""hvdsync's built-in Keras 3 models (registered as ``train.model`` names in :mod:`hvdsync.registry`): the same
architectures as :mod:`hvdsync.torch.models`."""
from __future__ import annotations

import keras


def mlp(n_features: int, hidden: int, n_classes: int) -> keras.Model:
    """A one-hidden-layer perceptron returning logits: enough for >= 0.9 test accuracy on digits in a few seconds."""
    return keras.Sequential([keras.Input((n_features,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(n_classes)])


def _conv_norm(width: int, groups: int = 4) -> list[keras.layers.Layer]:
    # PyTorch's Conv2d(padding=1, bias=False) + GroupNorm(eps=1e-5): the torch CNN's layers, channels last.
    return [keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
            keras.layers.GroupNormalization(groups, epsilon=1e-5)]


class ResidualBlock(keras.layers.Layer):
    """Two 3x3 convolutions with a skip connection (He et al., 2016), at constant width and resolution.

    GroupNorm, not BatchNorm: its statistics are per sample, so a rank's share of a batch normalises exactly as the
    whole batch would, and 2 workers x B stay equal to 1 process x 2B (BatchNorm would need
    :class:`~hvdsync.tensorflow.SyncBatchNormalization` for that).
    """

    def __init__(self, width: int, groups: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        self.width, self.groups = width, groups
        first, second = _conv_norm(width, groups), _conv_norm(width, groups)
        self.body = keras.Sequential([*first, keras.layers.ReLU(), *second])

    def call(self, x):
        return keras.ops.relu(x + self.body(x))

    def get_config(self) -> dict:
        return {**super().get_config(), "width": self.width, "groups": self.groups}


class CNN(keras.Model):
    """A small ResNet-style network for images ``(N, H, W, C)``: a 3x3 stem, ``blocks`` residual blocks, global
    average pooling and a linear classifier. Returns logits. The same layers as :class:`hvdsync.torch.CNN`.

    Args:
        n_classes: outputs.
        width: channels of every convolution (a multiple of 4).
        blocks: residual blocks.
    """

    def __init__(self, n_classes: int, width: int = 16, blocks: int = 2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.n_classes, self.width, self.blocks = n_classes, width, blocks
        self.stem = keras.Sequential([*_conv_norm(width), keras.layers.ReLU()])
        self.body = keras.Sequential([ResidualBlock(width) for _ in range(blocks)])
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(n_classes)

    def call(self, x):
        return self.head(self.pool(self.body(self.stem(x))))

    def get_config(self) -> dict:
        return {**super().get_config(), "n_classes": self.n_classes, "width": self.width, "blocks": self.blocks}


def build_cnn(cfg, data) -> keras.Model:
    """``train.model: cnn``: :class:`CNN` of width ``train.hidden`` for ``(H, W, C)`` image data sets (built)."""
    if len(data.input_shape) != 3:
        raise ValueError(f"train.model: 'cnn' is not allowed with samples of shape {data.input_shape}; it needs "
                         "images (height, width, channels): choose data.dataset digits_images or synthetic_images")
    model = CNN(data.n_classes, width=cfg.train.hidden)
    model(keras.ops.zeros((1, *data.input_shape)))  # a subclassed model makes its variables at its first call
    return model


def local_optimizer(cfg, model: keras.Model, lr: float) -> keras.optimizers.Optimizer:
    """The per-rank optimizer that :func:`hvdsync.tensorflow.distributed_optimizer` wraps, already built over
    ``model``'s variables (Keras 3 would otherwise create its slot variables lazily, at the first update)."""
    if cfg.train.optimizer == "adam":
        optimizer = keras.optimizers.Adam(learning_rate=lr)
    else:
        optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=cfg.train.momentum)
    optimizer.build(model.trainable_variables)
    return optimizer


def build_mlp(cfg, data) -> keras.Model:
    """``train.model: mlp`` (:mod:`hvdsync.registry`): ``train.hidden`` units; image samples are flattened first."""
    model = mlp(data.n_features, cfg.train.hidden, data.n_classes)
    if len(data.input_shape) == 1:
        return model
    return keras.Sequential([keras.Input(data.input_shape), keras.layers.Flatten(), *model.layers])


def constant_learning_rate(optimizer: keras.optimizers.Optimizer):
    """The optimizer's learning-rate variable, for a growing batch to set (``data.batch_growth``); a schedule fails
    naming the field."""
    rate = optimizer.learning_rate
    if not hasattr(rate, "assign"):
        raise ValueError("data.batch_growth: a learning-rate schedule is not allowed with a growing batch; give "
                         "the optimizer a constant learning rate (train.growth_lr scales it)")
    return rate
