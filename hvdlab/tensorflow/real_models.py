"""The two real model sizes of the lab's model benchmarks in Keras 3 (the PyTorch ones: :mod:`hvdlab.torch.real_models`).

* :func:`resnet50`: ``keras.applications.ResNet50(weights=None)`` with its top (1000 classes). Its convolutions carry
  biases (torchvision's do not), so it trains 25,583,592 parameters in 214 tensors, not torchvision's 25,557,032 in
  161: the 53 convolutions add a bias tensor each, 26,560 values (the sum of their output channels);
  ``tests/unit/test_real_models.py`` checks that difference against the torch network.
* :func:`bert_base`: an encoder with Hugging Face ``BertModel``'s shapes (``bert-base-uncased``) from Keras layers:
  the word, position and token-type embeddings and their layer norm, 12 layers of ``MultiHeadAttention`` (12 heads
  of 64: query, key, value and output kernels and biases, the same values as BERT's four dense layers), a layer
  norm, the 3072-wide feed-forward and a layer norm, then the pooler: 109,482,240 parameters in 199 tensors, as in
  PyTorch. Its loss, as there: masked-token prediction through the word embeddings (tied) plus a term on the pooled
  output.

:func:`batch` makes a synthetic batch at a chosen input size; :func:`loss` the step's loss.
"""
from __future__ import annotations

import math

import numpy as np

MODELS = ("resnet50", "bert-base")
BERT_BASE = {"vocab": 30522, "hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "positions": 512, "types": 2}
MASKED_SHARE = 0.15


def resnet50(size: int = 224):
    import keras

    # The input side is the benchmark's choice (the weights do not depend on it; keras asks for >= 32).
    return keras.applications.ResNet50(weights=None, include_top=True, input_shape=(size, size, 3), classes=1000)


def bert_base():
    import keras

    c = BERT_BASE

    class BertBase(keras.Model):
        def __init__(self):
            super().__init__()
            init = keras.initializers.TruncatedNormal(stddev=0.02)
            self.word = keras.layers.Embedding(c["vocab"], c["hidden"], embeddings_initializer=init)
            self.position = keras.layers.Embedding(c["positions"], c["hidden"], embeddings_initializer=init)
            self.token_type = keras.layers.Embedding(c["types"], c["hidden"], embeddings_initializer=init)
            self.embed_norm = keras.layers.LayerNormalization(epsilon=1e-12)
            self.blocks = []
            for _ in range(c["layers"]):
                self.blocks.append((
                    keras.layers.MultiHeadAttention(c["heads"], c["hidden"] // c["heads"], kernel_initializer=init),
                    keras.layers.LayerNormalization(epsilon=1e-12),
                    keras.layers.Dense(c["ffn"], activation="gelu", kernel_initializer=init),
                    keras.layers.Dense(c["hidden"], kernel_initializer=init),
                    keras.layers.LayerNormalization(epsilon=1e-12)))
            self.pooler = keras.layers.Dense(c["hidden"], activation="tanh", kernel_initializer=init)

        def call(self, ids, types):
            from keras import ops

            pos = ops.arange(ops.shape(ids)[1])
            x = self.embed_norm(self.word(ids) + self.position(pos)[None] + self.token_type(types))
            for attn, norm1, ffn_in, ffn_out, norm2 in self.blocks:
                x = norm1(x + attn(x, x))
                x = norm2(x + ffn_out(ffn_in(x)))
            return x, self.pooler(x[:, 0])

    model = BertBase()
    zeros = np.zeros((1, 2), dtype="int32")
    model(zeros, zeros)   # build every weight
    return model


def build(name: str, size: int = 224):
    if name == "resnet50":
        return resnet50(size)
    if name == "bert-base":
        return bert_base()
    raise ValueError(f"model: {name!r} is not allowed; choose one of: {', '.join(MODELS)}")


def batch(name: str, size: int, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """As :func:`hvdlab.torch.real_models.batch`, channels last for images, as numpy arrays."""
    if size < 1 or batch_size < 1:
        raise ValueError(f"size {size!r}, batch {batch_size!r}: both must be integers >= 1")
    rng = np.random.default_rng(seed)
    if name == "resnet50":
        if size < 32 or batch_size * math.ceil(size / 32) ** 2 < 2:
            raise ValueError(f"size {size}, batch {batch_size}: not allowed for resnet50; images of at least 32 x 32, "
                             f"and batch x ceil(size / 32)^2 >= 2 (batch normalisation at the last stage)")
        return {"x": rng.standard_normal((batch_size, size, size, 3), dtype=np.float32),
                "y": rng.integers(0, 1000, batch_size).astype("int32")}
    if name == "bert-base":
        if size > BERT_BASE["positions"]:
            raise ValueError(f"size: {size} is not allowed for bert-base; at most {BERT_BASE['positions']} tokens")
        ids = rng.integers(0, BERT_BASE["vocab"], (batch_size, size)).astype("int32")
        types = np.broadcast_to((np.arange(size) >= size // 2).astype("int32"), (batch_size, size)).copy()
        n_mask = max(1, math.ceil(MASKED_SHARE * size))
        masked = np.stack([rng.permutation(size)[:n_mask] for _ in range(batch_size)]).astype("int32")
        return {"ids": ids, "types": types, "masked": masked, "targets": np.take_along_axis(ids, masked, 1)}
    raise ValueError(f"model: {name!r} is not allowed; choose one of: {', '.join(MODELS)}")


def loss(name: str, model, b: dict):
    """The step's loss, as in :func:`hvdlab.torch.real_models.loss` (call it under a ``tf.GradientTape``)."""
    import tensorflow as tf

    if name == "resnet50":
        # keras' ResNet50 ends in a softmax: the loss takes probabilities.
        return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(b["y"], model(b["x"], training=True)))
    if name == "bert-base":
        seq, pooled = model(b["ids"], b["types"])
        logits = tf.matmul(tf.gather(seq, b["masked"], batch_dims=1), model.word.embeddings, transpose_b=True)
        ce = tf.keras.losses.sparse_categorical_crossentropy(b["targets"], logits, from_logits=True)
        return tf.reduce_mean(ce) + tf.reduce_mean(tf.square(pooled))
    raise ValueError(f"model: {name!r} is not allowed; choose one of: {', '.join(MODELS)}")


def gradient_tensors(model) -> tuple[int, int]:
    """``(parameters, tensors)`` that get a gradient (the trainable weights)."""
    ws = model.trainable_weights
    return sum(int(np.prod(w.shape)) for w in ws), len(ws)
