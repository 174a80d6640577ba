"""Worker script of tests/parallel/test_horovod_elastic.py: a plain Horovod elastic training loop (no hvdsync),
PyTorch (``hvd.elastic.TorchState``; ``torch-sampler``: with ``hvd.elastic.ElasticSampler``) or TensorFlow with
Keras 3 (``hvd.elastic.TensorFlowKerasState``), run by
``horovodrun --host-discovery-script``.

The job is built so that its result does not depend on how many workers ran which step: every rank draws the same
batch for a step (seeded by the step number), so the averaged gradient is the one-process gradient, and the final
parameters after ``--steps`` steps equal a one-process run of SGD with momentum, whatever resets happened, provided
each reset restored the committed model, optimizer state (momentum) and step together. The test checks that against
numpy (:func:`reference`).

Rank 0 appends one JSON line per event to ``--events``: ``{"event": "step", "step", "size"}`` after each step,
``{"event": "reset", "step", "size"}`` when a reset restored a committed state, ``{"event": "done", "step",
"params"}`` at the end. ``--exit-rank R --exit-step S`` makes rank R exit with status 3 before step S, once (the
``--exit-flag`` file remembers it), to inject a failed worker.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

FEATURES, BATCH, LR, MOMENTUM = 4, 16, 0.05, 0.9


def batch(step):
    """The same samples on every rank for a given step: y = x @ w_true + 0.5 + noise."""
    rs = np.random.RandomState(1000 + step)
    x = rs.randn(BATCH, FEATURES).astype(np.float32)
    w_true = np.arange(1, FEATURES + 1, dtype=np.float32).reshape(FEATURES, 1) / FEATURES
    y = (x @ w_true + 0.5 + 0.1 * rs.randn(BATCH, 1)).astype(np.float32)
    return x, y


def initial():
    rs = np.random.RandomState(7)
    return rs.randn(FEATURES, 1).astype(np.float32) * 0.1, np.zeros((1,), np.float32)


def reference(steps):
    """One process, float64, the same SGD with momentum (torch's form; Keras's is the same up to rounding)."""
    w, b = (a.astype(np.float64) for a in initial())
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for step in range(steps):
        x, y = batch(step)
        err = x @ w + b - y                         # d/dpred of mean((pred - y)^2) = 2 err / n
        gw, gb = 2 * x.T @ err / BATCH, 2 * err.sum(0) / BATCH
        vw, vb = MOMENTUM * vw + gw, MOMENTUM * vb + gb
        w, b = w - LR * vw, b - LR * vb
    return [w, b]


def _log(path, **event):
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def _maybe_exit(args, rank, step):
    if rank == args.exit_rank and step == args.exit_step and not os.path.exists(args.exit_flag):
        open(args.exit_flag, "w").close()
        sys.stdout.flush()
        os._exit(3)


def _run_steps(args, hvd, state, step):
    """The elastic loop both frameworks share: ``step(state)`` trains one batch; a commit every
    ``--commit-every`` steps; rank 0 logs each step and each reset. Returns the state after ``--steps`` steps."""
    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            _maybe_exit(args, hvd.rank(), state.step)
            step(state)
            state.step += 1
            if hvd.rank() == 0:
                _log(args.events, event="step", step=state.step, size=hvd.size())
            if state.step % args.commit_every == 0:
                state.commit()
            time.sleep(args.step_sleep)

    def on_reset():
        if hvd.rank() == 0:
            _log(args.events, event="reset", step=state.step, size=hvd.size())

    state.register_reset_callbacks([on_reset])
    train(state)
    return state


def run_torch(args):
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.set_num_threads(1)
    w0, b0 = initial()
    model = torch.nn.Linear(FEATURES, 1)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w0.T.copy()))
        model.bias.copy_(torch.from_numpy(b0))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    def step(state):
        x, y = (torch.from_numpy(a) for a in batch(state.step))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    state = _run_steps(args, hvd, hvd.elastic.TorchState(model, opt, step=0), step)
    if hvd.rank() == 0:
        params = [model.weight.detach().numpy().T.tolist(), model.bias.detach().numpy().tolist()]
        _log(args.events, event="done", step=state.step, size=hvd.size(), params=params)


def run_torch_sampler(args):
    """One epoch over 96 samples with ``hvd.elastic.ElasticSampler`` (no shuffling) in ``TorchState``; every rank
    appends ``{"event": "batch", "rank", "batch", "indices"}`` to ``--events``.rank<r>, rank 0 also
    ``{"event": "reset", "processed"}`` (the sampler's committed count) after a reset."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.set_num_threads(1)
    dataset = torch.utils.data.TensorDataset(torch.arange(96))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    model = torch.nn.Linear(1, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())

    @hvd.elastic.run
    def train(state):
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=state.sampler)
        for batch, (idx,) in enumerate(loader):
            _maybe_exit(args, hvd.rank(), batch)
            opt.zero_grad()
            model(idx.float().unsqueeze(1)).sum().backward()
            opt.step()
            _log(f"{args.events}.rank{hvd.rank()}", event="batch", rank=hvd.rank(), size=hvd.size(),
                 batch=batch, indices=idx.tolist())
            state.sampler.record_batch(batch, 4)
            if (batch + 1) % args.commit_every == 0:
                state.commit()
            time.sleep(args.step_sleep)

    state = hvd.elastic.TorchState(model, opt, sampler=sampler)

    def on_reset():
        if hvd.rank() == 0:
            _log(f"{args.events}.rank0", event="reset", size=hvd.size(), processed=state.sampler.processed_num)

    state.register_reset_callbacks([on_reset])
    train(state)


def run_keras(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    hvd.init()
    w0, b0 = initial()
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.layers[0].set_weights([w0, b0])
    opt = keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM)

    def step(state):
        x, y = batch(state.step)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        # Horovod's own averaging of a plain tape, as a user's script has it (patch 0008 under Keras 3)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    state = _run_steps(args, hvd, hvd.elastic.TensorFlowKerasState(model, opt, step=0), step)
    if hvd.rank() == 0:
        w, b = model.layers[0].get_weights()
        _log(args.events, event="done", step=state.step, size=hvd.size(), params=[w.tolist(), b.tolist()],
             optimizer_iterations=int(opt.iterations.numpy()))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["torch", "keras", "torch-sampler"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--commit-every", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--events", required=True)
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--exit-step", type=int, default=-1)
    p.add_argument("--exit-flag", default="exited.flag")
    args = p.parse_args(argv)
    {"torch": run_torch, "keras": run_keras, "torch-sampler": run_torch_sampler}[args.framework](args)


if __name__ == "__main__":
    main()
