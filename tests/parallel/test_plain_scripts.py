"""examples/plain/: a plain Horovod script run by ``horovodrun`` and a plain DDP script run by ``torchrun``, both
sharding with PyTorch's ``DistributedSampler``, compute what hvdsync computes on the same samples: the parameters
after 2 epochs agree to float32 rounding (measured 1.8e-7). Real launchers, real processes, Gloo on loopback."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from hvdsync import launch
from hvdsync.config import Config

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def hvdsync_params(cfg_dict):
    import hvdsync.torch as ht
    from hvdsync import datasets
    from hvdsync.config import Config
    from hvdsync.fitting import fit_loop

    cfg = Config.from_dict(cfg_dict)
    data = datasets.load(cfg.data, cfg.train.seed)
    ht.init(cfg)
    backend = ht.build(cfg, data)
    fit_loop(cfg, backend, data)
    return [p.copy() for p in backend.parameters()]


def _run(cmd, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def _diff(a, b):
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b, strict=True))


def test_plain_horovod_and_ddp_scripts_compute_what_hvdsync_computes(tmp_path):
    _run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(ROOT / "examples/plain/ddp_torchrun.py"),
          "--epochs", "2", "--out", str(tmp_path / "ddp.npz")], tmp_path)
    _run([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
          str(ROOT / "examples/plain/horovod_torch.py"), "--epochs", "2", "--out", str(tmp_path / "horovod.npz")],
         tmp_path)
    cfg = Config().replace(train={"np": 2, "epochs": 2, "seed": 0}, data={"shuffle": False},
                           tracking={"enabled": False})
    ours = launch.run(hvdsync_params, args=(cfg.to_dict(),), np=2, progress=False)[0]
    ddp = list(np.load(tmp_path / "ddp.npz").values())
    horovod = list(np.load(tmp_path / "horovod.npz").values())
    assert [p.shape for p in ddp] == [p.shape for p in ours] == [(64, 64), (64,), (10, 64), (10,)]
    assert _diff(ddp, ours) < 1e-5 and _diff(horovod, ours) < 1e-5
    # and training moved them: the comparison is not of two untouched initialisations
    after_one_epoch = launch.run(hvdsync_params, args=(cfg.replace(train={"epochs": 1}).to_dict(),), np=2,
                            progress=False)[0]
    assert _diff(after_one_epoch, ours) > 1e-3
