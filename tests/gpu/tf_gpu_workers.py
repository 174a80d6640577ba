"""Runs inside TensorFlow Horovod workers on GPUs (sent by value): tests/gpu/test_gpu_tensorflow.py asserts on what
they return. Apart from gpu_workers.py, which imports torch: the TensorFlow GPU image (hvdsync:gpu-tf) has none."""


def tf_collectives() -> dict:
    """TensorFlow's Horovod ops (NCCL) on GPU tensors: all-reduce (sum, average), grouped all-reduce, allgather,
    broadcast; each result's largest difference from the arithmetic, and the devices the results are on."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.tensorflow import init

    init(Config.from_dict({"train": {"framework": "tensorflow", "device": "cuda"}}))
    rank, size = hvd.rank(), hvd.size()
    base = np.arange(1000, dtype=np.float32)
    total = size * base + sum(range(size))

    def err(got, want):
        return float(np.abs(np.asarray(got, dtype=np.float64) - want).max())

    with tf.device("/GPU:0"):     # the one GPU init left this rank
        x = tf.constant(base + rank)
        summed = hvd.allreduce(x, op=hvd.Sum, name="tf.gpu.sum")
        averaged = hvd.allreduce(x, op=hvd.Average, name="tf.gpu.average")
        grouped = hvd.grouped_allreduce([x, 2 * x[:17]], op=hvd.Sum, name="tf.gpu.grouped")
        gathered = hvd.allgather(tf.fill([rank + 1, 3], float(rank)), name="tf.gpu.allgather")
        b = hvd.broadcast(tf.fill([5], float(rank)), root_rank=size - 1, name="tf.gpu.broadcast")
    want_gathered = np.concatenate([np.full((r + 1, 3), float(r)) for r in range(size)])
    return {"size": size, "nccl_built": bool(hvd.nccl_built()), "visible_gpus": len(tf.config.get_visible_devices("GPU")),
            "sum": err(summed, total), "average": err(averaged, total / size),
            "grouped": max(err(grouped[0], total), err(grouped[1], 2 * total[:17])),
            "allgather": err(gathered, want_gathered), "broadcast": err(b, np.full(5, float(size - 1))),
            # "/job:localhost/replica:0/task:0/device:GPU:0" -> "GPU"
            "result_devices": sorted({t.device.rsplit("device:", 1)[-1].split(":")[0]
                                      for t in (summed, averaged, grouped[0], gathered, b)})}


def tf_fit_on_gpu(epochs: int = 10) -> dict:
    """``hvdsync.tensorflow.fit`` with the defaults on the GPU (train.device=cuda): the result, and what was visible."""
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.tensorflow import fit

    cfg = Config.from_dict({"train": {"framework": "tensorflow", "epochs": epochs, "device": "cuda"},
                            "tracking": {"enabled": False}})
    result = fit(cfg).to_dict()
    return {"visible_gpus": len(tf.config.get_visible_devices("GPU")),
            **{k: result[k] for k in ("test_accuracy", "param_spread", "world_size", "optimizer_steps")}}
