"""Your own CNN on your own tf.data pipeline with your own training step (tf.GradientTape), on Horovod workers.

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tensorflow_cnn.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tensorflow_cnn.py --set sync.accumulate=2

The same pieces as examples/keras_fit.py, driven by hand: the plan's stream gives each batch's loss weights, so the
mean loss is right also on the short last step; the optimizer all-reduces every ``accumulate`` batches and applies
their sum.
"""
import hvdsync.tensorflow as hs  # first: it keeps TensorFlow's start-up lines out of the terminal
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from hvdsync.config import from_command_line

cfg = from_command_line(framework="tensorflow")
info = hs.init(cfg)
digits = load_digits()
images = tf.constant((digits.images / 16.0)[..., None], tf.float32)
labels = tf.constant(digits.target, tf.int64)
n_train = 1400


class SmallCNN(keras.Model):  # your model
    def __init__(self):
        super().__init__()
        self.convs = [keras.layers.Conv2D(w, 3, padding="same", activation="relu") for w in (16, 32)]
        self.flat, self.head = keras.layers.Flatten(), keras.layers.Dense(10)

    def call(self, x):
        for conv in self.convs:
            x = conv(x)
        return self.head(self.flat(x))


model = SmallCNN()
model(images[:1])  # create its variables (a subclassed model makes them at its first call)
optimizer = hs.distributed_optimizer(keras.optimizers.Adam(0.002 * info.size), model, cfg.sync)
hs.broadcast_state(model, optimizer)  # every rank starts from rank 0's weights
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
sampler = hs.PlanSampler.from_config(cfg, n_train)
stream = sampler.dataset(lambda i: (tf.gather(images, i), tf.gather(labels, i)))


@tf.function
def train_step(x, y, weights):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True), sample_weight=weights)
        # A batch-mean loss, as Keras' fit computes it: scale_loss divides it by sync.accumulate, as fit does, so the
        # SUM of the accumulated batches the optimizer applies is their mean (and scales it under fp16).
        scaled = optimizer.scale_loss(loss)
    optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
    return loss


for epoch in range(cfg.train.epochs):
    sampler.set_epoch(epoch)
    losses = [float(train_step(x, y, w)) for x, y, w in stream]
    hits = np.argmax(model(images[n_train:]), axis=1) == digits.target[n_train:]  # the same test set on every rank
    if info.rank == 0:
        print(f"epoch {epoch}: loss {np.mean(losses):.4f}, test accuracy {hits.mean():.4f}")
