"""Your own Keras model and tf.data pipeline, trained with model.compile + model.fit on Horovod workers.

    horovodrun -np 2 -H localhost:2 --gloo python examples/keras_fit.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/keras_fit.py --set sync.compression=fp16 --set sync.accumulate=2

What hvdsync adds to plain Keras: a distributed optimizer that is a Keras optimizer (all-reduce, accumulation,
compression), the plan's index stream for your tf.data pipeline (every sample once per epoch, the same number of
batches on every rank), and the callbacks (broadcast, metrics over all ranks, warm-up, MLflow on rank 0).
"""
import hvdsync.tensorflow as hs  # first: it keeps TensorFlow's start-up lines out of the terminal
import keras
import tensorflow as tf
from sklearn.datasets import load_digits

from hvdsync.config import from_command_line

cfg = from_command_line(framework="tensorflow")
info = hs.init(cfg)

# ---- your data and your model -----------------------------------------------------------------------------------
digits = load_digits()
images = tf.constant((digits.images / 16.0)[..., None], tf.float32)  # (1797, 8, 8, 1)
labels = tf.constant(digits.target, tf.int64)
train, test = tf.range(0, 1400, dtype=tf.int64), tf.range(1400, 1797, dtype=tf.int64)

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(10),
])

# ---- distributed: the optimizer, the data stream, the callbacks -------------------------------------------------
lr = 0.002 * info.size  # Goyal et al.: scale the rate with the global batch, warm it up over 2 epochs
model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.Adam(lr), sync=cfg.sync),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
              jit_compile=False)  # Horovod's collectives have no XLA kernels
sampler = hs.PlanSampler.from_config(cfg, len(train))  # this rank's share of each epoch, as index batches
stream = sampler.dataset(lambda i: (tf.gather(images, tf.gather(train, i)), tf.gather(labels, tf.gather(train, i))))
mine = tf.gather(test, tf.range(info.rank, len(test), info.size))  # each rank scores its share of the test set
validation = tf.data.Dataset.from_tensor_slices((tf.gather(images, mine), tf.gather(labels, mine))).batch(64)
callbacks = [sampler, *hs.callbacks.standard_callbacks(cfg, target_lr=lr, warmup_epochs=2)]
history = model.fit(stream, validation_data=validation, epochs=cfg.train.epochs, callbacks=callbacks,
                    shuffle=False, verbose=2 if info.rank == 0 else 0)  # the plan shuffles, alike on every rank
if info.rank == 0:
    print(f"keras fit x{info.size}: validation accuracy {history.history['val_accuracy'][-1]:.4f} "
          f"after {cfg.train.epochs} epochs (over all ranks' samples)")
