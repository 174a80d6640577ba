"""Elastic training of your own PyTorch model with hvdsync's state, as a plain Horovod script (a cluster's way).

On a cluster, a host-discovery script prints the hosts that exist right now (one ``name:slots`` per line); Horovod
runs it every second and adds or removes workers as its output changes:

    horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover_hosts.sh \\
        python examples/elastic_torch.py --set elastic.checkpoint_dir=/shared/ckpt --set elastic.commit_every=20

On one machine, hvdsync writes such a script over loopback names for you (``hvdsync.launch.elastic``):

    hvdsync train --elastic --np 2 --min-np 1 --max-np 3 --checkpoint-dir ckpt [--resume]

The pattern: build the model and optimizer, make the state, and train inside ``run_elastic``; the training
function reads where to start from ``state.position`` and reports each step with ``state.step_done``. Rank 0 writes
the durable checkpoints; a new job with ``--set elastic.resume=true`` starts from the newest valid one.
"""
import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hvdsync.torch as hs
from hvdsync.config import from_command_line
from hvdsync.datasets import load

cfg = from_command_line(framework="torch")
hs.init(cfg)
data = load(cfg.data, cfg.train.seed)
dataset = TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))  # your own Dataset

# Your model and optimizer (anything torch): nothing collective yet, the state's first sync broadcasts rank 0's.
model = torch.nn.Sequential(torch.nn.Linear(data.n_features, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = hs.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=0.9), model,
                                     cfg.sync)
state = hs.elastic_state(model, optimizer, cfg)


def train(state):
    # Re-entered after every reset: a sampler for the current world size, at the committed position, so the rest
    # of the epoch is re-planned from the samples consumed (no sample twice, none skipped).
    sampler = hs.PlanSampler(dataset, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed)
    sampler.load_state_dict(state.plan_state())
    loader = DataLoader(dataset, batch_sampler=sampler)
    while state.position.epoch < cfg.train.epochs:
        sampler.set_epoch(state.position.epoch)  # keeps a mid-epoch position loaded above
        for micro, step in sampler.steps(loader):
            optimizer.zero_grad()
            for x, y in micro:
                (F.cross_entropy(model(x), y, reduction="sum") * sampler.scale(step)).backward()
            optimizer.step()
            state.step_done(step.global_count)  # commits every elastic.commit_every steps
        state.epoch_done()
        if hvd.rank() == 0:
            print(f"epoch {state.position.epoch} done on {hvd.size()} workers, step {state.position.step}", flush=True)


hs.run_elastic(train, state)
if hvd.rank() == 0:
    for event in state.events:
        print(f"reset: {event['reason']}, {event['size_before']} -> {event['size_after']} workers, "
              f"recovered in {event['recovery_seconds']:.1f}s")
