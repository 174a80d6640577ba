"""Your own CNN on your own torch Dataset, read by a DataLoader through hvdsync's PlanSampler, on Horovod.

Launch it like any Horovod script (2 local workers over Gloo; on a cluster: -np 8 -H host1:4,host2:4):

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch_cnn.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch_cnn.py \
        --set sync.accumulate=2 --set sync.compression=fp16

Everything hvdsync-specific is in `main`: the sampler gives each rank its share of every global batch (each sample
once per epoch, any number of workers), `fit` wraps your optimizer for Horovod, broadcasts rank 0's model, scales the
loss for accumulation and records the run in MLflow on rank 0 (`MLFLOW_TRACKING_URI`, default ./mlflow.db).
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hvdsync.torch as hs
from hvdsync.config import from_command_line
from hvdsync.datasets import digits


class DigitImages(Dataset):
    """Your data: here scikit-learn's 8x8 digits as 1x8x8 tensors (a file-backed Dataset works the same way)."""

    def __init__(self, x, y):
        self.x, self.y = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class SmallCNN(nn.Module):
    """Your model: two convolutions, max-pooling, a linear classifier (for 1 x 8 x 8 images)."""

    def __init__(self, classes=10, width=16):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classify = nn.Linear(2 * width * 4 * 4, classes)

    def forward(self, x):
        return self.classify(self.features(x).flatten(1))


def main():
    cfg = from_command_line(framework="torch")   # --config run.yaml, --set section.field=value (repeatable)
    hs.init(cfg)                                  # hvd.init with the config's Horovod knobs, threads, seeds
    split = digits(seed=cfg.train.seed, images=True)
    train, test = DigitImages(split.x_train, split.y_train), DigitImages(split.x_test, split.y_test)
    sampler = hs.PlanSampler.from_config(cfg, train)   # batch size, accumulation, seed from the config
    loader = DataLoader(train, batch_sampler=sampler, num_workers=2, pin_memory=torch.cuda.is_available())
    model = SmallCNN()
    result = hs.fit(cfg, model=model, loss=nn.CrossEntropyLoss(label_smoothing=0.1), train=loader, test=test,
                    optimizer=torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum))
    if result.rank == 0:
        print(result.summary())


if __name__ == "__main__":
    main()
