"""The epoch's evaluation in TensorFlow: Keras' eager model call on the whole test slice against hvdsync's traced,
chunked ``count_correct`` (what ``fit``'s default evaluation runs), interleaved in one process.

    python benchmarks/step.py tf-eval             # the MLP of shares.py at hidden 4096 and 16384
    python benchmarks/step.py tf-eval --hidden 1024 --repeats 15

The evaluation is part of every epoch and no share of a step shortens it: with straggler-aware shares it is part of
what the epoch cannot win back (docs/measurements/shares.md). One worker process, one thread (as
each of 2 workers on 2 cores), the test slice of one of 2 ranks; per contender the median wall and process CPU time
of ``--repeats`` rounds (the contenders alternate within each round, so machine noise hits both alike).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def measure(hidden: int, repeats: int) -> dict:
    import numpy as np

    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.core.train.loop import array_evaluator
    from hvdsync.core.train.shares import share_slice
    from hvdsync.tensorflow.train import build

    cfg = Config.from_dict({"data": {"dataset": "synthetic", "synthetic_samples": 65536},
                            "train": {"framework": "tensorflow", "hidden": hidden}, "tracking": {"enabled": False}})
    data = datasets.load(cfg.data, 0)
    backend = build(cfg, data)
    backend.rank, backend.size = 0, 2  # score rank 0's slice of a 2-worker job
    # The same samples the evaluator scores: rank 0's contiguous part (a rank's part follows the shares since the
    # evaluation was cut by them; a strided slice here counted other samples and failed the check below).
    part = share_slice(len(data.x_test), 0, 2)
    x, y = data.x_test[part], data.y_test[part]

    def eager() -> int:  # what count_correct did before: Keras' eager call, all samples at once
        return int(np.sum(np.argmax(backend.model(x, training=False), axis=1) == y))

    traced = array_evaluator(backend, data)
    contenders = {"eager, whole slice": eager, "traced, chunks of 512": lambda: traced()["test_accuracy"][0]}
    assert len({fn() for fn in contenders.values()}) == 1, "both count the same correct predictions"
    wall: dict = {k: [] for k in contenders}
    cpu: dict = {k: [] for k in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return {"hidden": hidden, "samples": len(x), **{name: {"wall_ms": 1e3 * statistics.median(wall[name]),
                                                          "cpu_ms": 1e3 * statistics.median(cpu[name])}
                                                   for name in contenders}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="step.py tf-eval", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()  # one worker: build() wants Horovod's rank and size
    rows = []
    for hidden in args.hidden:
        r = measure(hidden, args.repeats)
        rows.append(r)
        e, t = r["eager, whole slice"], r["traced, chunks of 512"]
        print(f"MLP 64-{hidden}-10, {r['samples']} test samples: eager {e['wall_ms']:.1f} ms (CPU {e['cpu_ms']:.1f}), "
              f"traced in chunks {t['wall_ms']:.1f} ms (CPU {t['cpu_ms']:.1f}); traced / eager "
              f"{t['wall_ms'] / e['wall_ms']:.2f} (CPU {t['cpu_ms'] / e['cpu_ms']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0
