"""Elastic training of your own Keras 3 model with hvdsync's state, as a plain Horovod script (a cluster's way).

    horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover_hosts.sh \\
        python examples/elastic_tensorflow.py --set elastic.checkpoint_dir=/shared/ckpt

On one machine: ``hvdsync train --framework tensorflow --elastic --np 2 --min-np 1 --max-np 3 --checkpoint-dir ckpt``.
The same pattern as ``examples/elastic_torch.py``; the state re-broadcasts every Keras variable (model, optimizer
slots, accumulation sums) from rank 0 after each reset, and TensorFlow's collective errors become resets.
"""
import horovod.tensorflow as hvd
import keras
import tensorflow as tf

import hvdsync.tensorflow as hs
from hvdsync.config import from_command_line
from hvdsync.datasets import load
from hvdsync.tensorflow import loss_scale, ShardPlan

cfg = from_command_line(framework="tensorflow")
hs.init(cfg)
data = load(cfg.data, cfg.train.seed)

model = keras.Sequential([keras.Input((data.n_features,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10)])
optimizer = hs.distributed_optimizer(keras.optimizers.SGD(cfg.train.lr, momentum=0.9), model, cfg.sync)
state = hs.elastic_state(model, optimizer, cfg)  # builds the optimizer's lazy slots first


@tf.function(reduce_retracing=True)  # batch sizes vary (the last step of an epoch is short)
def backward(x, y, scale):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True))
    optimizer.accumulate(tape.gradient(loss * scale, model.trainable_variables))


def train(state):
    size, rank = hvd.size(), hvd.rank()
    plan = ShardPlan(len(data.x_train), size, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed)
    while state.position.epoch < cfg.train.epochs:
        for step in plan.epoch(state.position.epoch, rank, start=state.position.consumed):
            for idx in step.micro:
                scale = tf.constant(loss_scale(step.global_count, size, cfg.sync.op), tf.float32)
                backward(data.x_train[idx], data.y_train[idx], scale)
            optimizer.synchronize()
            optimizer.step()
            state.step_done(step.global_count)
        state.epoch_done()
        if rank == 0:
            print(f"epoch {state.position.epoch} done on {size} workers, step {state.position.step}", flush=True)


hs.run_elastic(train, state)
if hvd.rank() == 0:
    for event in state.events:
        print(f"reset: {event['reason']}, {event['size_before']} -> {event['size_after']} workers, "
              f"recovered in {event['recovery_seconds']:.1f}s")
