"""Where hvdsync's Keras optimizer spends time over raw Horovod in one ``tf.function`` step (the adapter API path).

    python benchmarks/step.py tf-apply                 # the CNN of training.py, 200 interleaved steps
    python benchmarks/step.py tf-apply --model mlp --steps 20

Two Horovod workers (1 thread each) build one copy of the model per contender from the same start and run the same
step, one ``tf.function`` call each, interleaved step by step (so machine noise hits every contender alike):

* ``raw``: ``hvd.grouped_allreduce`` of the tape's gradients, then SGD (:mod:`hvdlab.bench.step_tf`'s raw contender);
* ``api``: ``hvdsync.tensorflow.distributed_optimizer(SGD)`` at ``accumulate=1``: the fast path (no sum variables);
* ``api_sums``: the same optimizer made to take its accumulation path at ``accumulate=1`` (gradients into sum
  variables, a ``tf.cond``, read back, zeroed): what the fast path saves;
* ``api_before``: ``api_sums`` with the wire counted by one ``py_function`` per gradient tensor (Horovod's
  ``compression=`` hook), as before the round was counted in one op: what hvdsync's step was before both changes;
* ``fit_step``: ``hvdsync.tensorflow.fit``'s step (``TensorFlowBackend.train_step``: the backward pass, the
  all-reduce and the update in one graph, its phases timed by the graph's clock reads);
* ``fit_3graphs``: the same three phases as three graph calls, as ``fit`` ran them before (what one graph saves).

Printed per contender: the median step time (the slower rank's) and its ratio to ``raw``, the median process CPU
time per step (less sensitive to the other jobs on a shared machine) and its ratio, the ops in the traced graph
(with the ops of the functions it calls, e.g. the branches of a ``tf.cond``), and the largest difference between its
final parameters and raw's: every contender takes the same steps from the same start, so a fast contender that
computes something else shows there (``--json PATH`` writes the same table).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CONTENDERS = ("raw", "api", "api_sums", "api_before", "fit_step", "fit_3graphs")


def _graph_ops(graph) -> int:
    called = graph._functions.values()  # the functions this graph calls (tf.cond branches): their ops run too
    return len(graph.get_operations()) + sum(len(f.definition.node_def) for f in called)


def worker(model_name: str, steps: int, warmup: int) -> dict:
    import horovod.tensorflow as hvd

    import hvdsync.tensorflow as hs
    from hvdsync.config import Config, SyncConfig

    hs.init(Config())  # one intra/inter-op thread per worker, as in training.py
    import keras
    import tensorflow as tf

    from hvdlab.bench.step_common import data, works
    from hvdlab.bench.step_tf import _ce, model

    work = works(False)[model_name]
    x, y = data(work)
    half = work.global_batch // hvd.size()
    x, y = x[hvd.rank() * half:(hvd.rank() + 1) * half], y[hvd.rank() * half:(hvd.rank() + 1) * half]
    spec = [tf.TensorSpec((None, *work.input_shape()), tf.float32), tf.TensorSpec((None,), tf.int64)]
    steps_fn, ops, models = {}, {}, {}
    for name in CONTENDERS:
        m = models[name] = model(work)
        if name.startswith("fit"):
            from hvdsync.core.train._scaling import loss_scale
            from hvdsync.tensorflow.train import TensorFlowBackend

            b = TensorFlowBackend(m, keras.optimizers.SGD(work.lr), SyncConfig(), input_shape=work.input_shape())
            # fit's loss is each pass's sum times this scale: with Horovod's average, the global batch's mean.
            scale = tf.constant(loss_scale(work.global_batch, hvd.size(), "average"))
            if name == "fit_step":
                steps_fn[name] = lambda x, y, b=b, scale=scale: b.train_step([(x, y)], scale)
                graphs = [b._fused[True]]
            else:
                steps_fn[name] = lambda x, y, b=b, s=scale: (b._first_backward(x, y, s), b._synchronize(), b._update())
                graphs = [b._first_backward, b._synchronize, b._update]
            shapes = spec + [tf.TensorSpec((), tf.float32)]
            ops[name] = sum(_graph_ops((g.get_concrete_function(*shapes) if g.input_signature else
                                        g.get_concrete_function()).graph) for g in graphs)
            continue
        if name == "raw":
            opt = keras.optimizers.SGD(work.lr)
            opt.build(m.trainable_variables)
            reduce = lambda g: hvd.grouped_allreduce(g, op=hvd.Average)  # noqa: E731
        else:
            opt = hs.distributed_optimizer(keras.optimizers.SGD(work.lr), m, SyncConfig())
            opt._phases_in_apply = name != "api"  # the accumulation path, as every step took it before
            if name == "api_before":
                red = opt.reducer
                red.reduce = lambda g, red=red: hvd.grouped_allreduce(list(g), op=red.op, compression=red.compression)
            reduce = None

        def step(x, y, m=m, opt=opt, reduce=reduce):
            with tf.GradientTape() as tape:
                loss = _ce(y, m(x, training=True))
            grads = tape.gradient(loss, m.trainable_variables)
            opt.apply(reduce(grads) if reduce else grads, m.trainable_variables)

        steps_fn[name] = tf.function(step, input_signature=spec)
        ops[name] = _graph_ops(steps_fn[name].get_concrete_function().graph)
    times = {n: [] for n in CONTENDERS}
    cpu = {n: [] for n in CONTENDERS}
    for i in range(warmup + steps):
        for name in CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]:
            c0, t0 = time.process_time(), time.perf_counter()
            steps_fn[name](x, y)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    # Every contender made the same steps from the same start on the same samples: the same parameters as raw's.
    raw = [v.numpy() for v in models["raw"].trainable_variables]
    diff = {n: max(float(abs(v.numpy() - r).max()) for v, r in zip(models[n].trainable_variables, raw))
            for n in CONTENDERS}
    hvd.shutdown()
    return {"times": times, "cpu": cpu, "ops": ops, "variables": len(m.trainable_variables), "diff": diff}


def main(argv: list[str] | None = None) -> int:
    from hvdlab.bench import report
    from hvdsync.launch.local import run

    p = argparse.ArgumentParser(prog="step.py tf-apply", description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--steps", type=int, default=200, help="timed steps per contender")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = p.parse_args(argv)
    print(f"{args.model}: 2 workers x 1 thread, {args.steps} interleaved steps; "
          f"load average {report.machine()['load']}", flush=True)
    ranks = run(worker, args=(args.model, args.steps, args.warmup), np=2, progress=False)
    step = {n: [max(a, b) for a, b in zip(ranks[0]["times"][n], ranks[1]["times"][n])] for n in CONTENDERS}
    cpu = {n: [(a + b) / 2 for a, b in zip(ranks[0]["cpu"][n], ranks[1]["cpu"][n])] for n in CONTENDERS}
    base, base_cpu = statistics.median(step["raw"]), statistics.median(cpu["raw"])
    print(f"{'contender':<11} {'step ms':>8} {'/raw':>6} {'CPU ms':>7} {'/raw':>6} {'graph ops':>9} "
          f"{'|param - raw|':>13}")
    rows = {}
    for n in CONTENDERS:
        med, c = statistics.median(step[n]), statistics.median(cpu[n])
        diff = max(r["diff"][n] for r in ranks)
        rows[n] = {"step_ms": med * 1e3, "step_over_raw": med / base, "cpu_ms": c * 1e3, "cpu_over_raw": c / base_cpu,
                   "graph_ops": ranks[0]["ops"][n], "param_diff": diff}
        print(f"{n:<11} {med * 1e3:8.2f} {med / base:6.3f} {c * 1e3:7.2f} {c / base_cpu:6.3f} {ranks[0]['ops'][n]:9d} "
              f"{diff:13.1e}")
    print(f"{ranks[0]['variables']} gradient tensors; load average at end {report.machine()['load']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "steps": args.steps, "rows": rows}, indent=1))
    return 0
