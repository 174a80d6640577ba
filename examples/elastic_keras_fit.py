"""Elastic training of your own Keras 3 model with ``model.fit``: commits every N steps, resumes after a reset at
the committed epoch and sample, on the world size of then.

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover_hosts.sh \\
        python examples/elastic_keras_fit.py --set elastic.commit_every=10 --set elastic.checkpoint_dir=/shared/ckpt

``fit`` runs inside ``hs.run_elastic``; when a worker is lost or hosts change, the survivors restore the last
commit (every Keras variable, the position in the plan), the ring re-forms, rank 0's state is broadcast, and
``train`` is called again: ``initial_epoch`` and the sampler's loaded state put ``fit`` at the committed epoch and
sample, and the rest of that epoch is re-planned for the new number of workers (no sample twice, none skipped).
"""
import hvdsync.tensorflow as hs  # first: it keeps TensorFlow's start-up lines out of the terminal
import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from sklearn.datasets import load_digits

from hvdsync.config import from_command_line

cfg = from_command_line(framework="tensorflow")
hs.init(cfg)

# ---- your data and your model -----------------------------------------------------------------------------------
digits = load_digits()
images = tf.constant((digits.images / 16.0)[..., None], tf.float32)  # (1797, 8, 8, 1)
labels = tf.constant(digits.target, tf.int64)
train_ids = tf.range(0, 1400, dtype=tf.int64)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.SGD(cfg.train.lr, momentum=0.9), sync=cfg.sync),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)

# ---- elastic: the state (nothing collective before run_elastic: its first sync broadcasts rank 0's variables) ----
state = hs.elastic_state(model, model.optimizer, cfg)


def lookup(i):
    return tf.gather(images, tf.gather(train_ids, i)), tf.gather(labels, tf.gather(train_ids, i))


def train(state):
    # A sampler for the world size of now (it changes on a reset), at the committed epoch and sample; commits every
    # elastic.commit_every steps through hs.callbacks.ElasticStateCallback.
    hs.keras_fit(state, model, lambda: hs.PlanSampler.from_config(cfg, len(train_ids)), lookup, cfg.train.epochs,
                 verbose=0)


hs.run_elastic(train, state)
if hvd.rank() == 0:  # ranks are reassigned on a reset
    print(f"keras fit, elastic: {state.position.step} steps; resets: "
          + ("; ".join(f"{e['reason']} {e['size_before']}->{e['size_after']}" for e in state.events) or "none"))
