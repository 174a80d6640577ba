"""Train an MLP on scikit-learn's digits with hvdsync + Horovod + TensorFlow (Keras 3), as a plain user script.

Launch it like any Horovod script (2 local workers over Gloo):

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tensorflow.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tensorflow.py --set sync.compression=fp16 --set sync.accumulate=4

or let hvdsync start the workers for you (same config, progress bar, quiet logs):

    hvdsync train --framework tensorflow --np 2 --compression fp16 --accumulate 4
"""
import argparse

from hvdsync.config import Config
from hvdsync.tensorflow import fit

parser = argparse.ArgumentParser()
parser.add_argument("--config", help="YAML config (sections: sync, data, train, tracking)")
parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
args = parser.parse_args()

cfg = Config.load(args.config, args.overrides + ["train.framework=tensorflow"])
result = fit(cfg)  # init Horovod, broadcast from rank 0, sharded data, distributed optimizer, MLflow on rank 0
if result.rank == 0:
    print(result.summary())
