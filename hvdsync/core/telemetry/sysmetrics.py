"""System metrics of every node (CPU, memory, disk, network, GPU where present), recorded in the job's one run.

MLflow's own ``SystemMetricsMonitor`` logs straight to the store from each process, needs the run to be created
there first, and stops for good at the first failed request (or when the run is not RUNNING). Here each node's
first local rank samples with MLflow's monitor classes (psutil; pynvml for NVIDIA GPUs) in a background thread,
the samples travel to rank 0 inside the monitor's all-gather, and rank 0 records them as
``system/<node>/<metric>`` (MLflow's naming with ``MLFLOW_SYSTEM_METRICS_NODE_ID``) through the spooled tracker,
so they survive a store outage like every other metric.
"""
from __future__ import annotations

import json
import os
import socket
import threading

import numpy as np

# Bytes of JSON one node's sample may take in the all-gather (8 GPUs x 5 figures fit).
PAYLOAD_BYTES = 4096


def node_id() -> str:
    """This node's name in metric keys: ``MLFLOW_SYSTEM_METRICS_NODE_ID`` if set, else the host name."""
    return os.environ.get("MLFLOW_SYSTEM_METRICS_NODE_ID") or socket.gethostname()


def _monitors() -> list:
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for module, cls in (("gpu_monitor", "GPUMonitor"), ("rocm_monitor", "ROCMMonitor")):
        try:  # no GPU, no driver or no pynvml: no GPU figures
            import importlib

            monitors.append(getattr(importlib.import_module(f"mlflow.system_metrics.metrics.{module}"), cls)())
            break
        except Exception:  # noqa: BLE001
            continue
    return monitors


class NodeSampler:
    """Samples this node every ``interval`` seconds in a daemon thread; :meth:`take` averages and clears.

    Args:
        interval: seconds between samples.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.monitors = _monitors()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="hvdsync-system-metrics", daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        with self._lock:
            for m in self.monitors:
                m.collect_metrics()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._collect()

    def take(self) -> dict[str, float]:
        """The averages since the last call (one fresh sample if none was taken yet)."""
        if not any(m.metrics for m in self.monitors):
            self._collect()
        with self._lock:
            out: dict[str, float] = {}
            for m in self.monitors:
                if m.metrics:
                    out.update(m.aggregate_metrics())
                m.clear_metrics()
        return {k: float(v) for k, v in out.items()}

    def close(self) -> None:
        self._stop.set()


def text_row(text: str, size: int) -> np.ndarray:
    """``text`` as UTF-8 bytes in a fixed-size float64 row (cut at ``size`` bytes; zeros: no text), so that every
    rank can put a string into the same numeric all-gather."""
    row = np.zeros(size, dtype=np.float64)
    data = text.encode()[:size]
    row[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    return row


def row_text(row: np.ndarray) -> str:
    """The text of a :func:`text_row` ('' for a row of zeros)."""
    return bytes(np.asarray(row, dtype=np.float64).astype(np.uint8)).rstrip(b"\0").decode(errors="replace")


def encode(sample: dict[str, float] | None, node: str = "") -> np.ndarray:
    """A fixed-size row carrying ``{"node": ..., "m": sample}`` (zeros: no sample), so that every rank can take part
    in the same all-gather whether or not it samples."""
    if sample is None:
        return text_row("", PAYLOAD_BYTES)
    return text_row(json.dumps({"node": node, "m": {k: round(v, 2) for k, v in sample.items()}}), PAYLOAD_BYTES)


def decode(row: np.ndarray) -> dict[str, float]:
    """``{"system/<node>/<metric>": value}`` from an :func:`encode` row ({} for a rank that does not sample)."""
    data = row_text(row)
    if not data:
        return {}
    try:
        payload = json.loads(data)
    except ValueError:  # cut at PAYLOAD_BYTES: drop rather than record half a sample
        return {}
    return {f"system/{payload['node']}/{k}": v for k, v in payload["m"].items()}


def samples_here() -> bool:
    """Whether this process samples its node: the first local rank (Horovod's launchers set HOROVOD_LOCAL_RANK)."""
    return os.environ.get("HOROVOD_LOCAL_RANK", "0") == "0"
