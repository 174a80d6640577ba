"""Train an MLP on scikit-learn's digits with hvdsync + Horovod, as a plain user script.

Launch it like any Horovod script (2 local workers over Gloo):

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch.py \
        --set sync.compression=fp16 --set sync.accumulate=4

or let hvdsync start the workers for you (same config, progress bar, quiet logs):

    hvdsync train --framework torch --np 2 --compression fp16 --accumulate 4
"""
from hvdsync.config import from_command_line
from hvdsync.torch import fit

cfg = from_command_line(framework="torch")  # --config run.yaml, --set section.field=value (repeatable)
result = fit(cfg)  # init Horovod, broadcast from rank 0, sharded data, distributed optimizer, MLflow on rank 0
if result.rank == 0:
    print(result.summary())
