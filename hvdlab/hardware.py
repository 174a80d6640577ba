"""What this machine has, measured: cores, memory, memory bandwidth, the cost of adding buffers, and loopback TCP.

These are the figures the cost model needs for a CPU job on one host (:mod:`hvdlab.costmodel`): Gloo moves
buffers between processes over TCP on the loopback interface (alpha, beta), and adds them on the CPU (gamma).
Everything is timed several times and the median kept: the machine may be shared, and single runs scatter.

Example:
    >>> facts = describe()
    >>> facts["logical_cpus"] >= 1 and facts["memory_bytes"] > 0
    True
"""
from __future__ import annotations

import multiprocessing as mp
import os
import platform
import socket
import time
from typing import Callable

import numpy as np


def describe() -> dict:
    """Cores (logical, usable by this process), CPU model, total memory, OS."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    memory = 0
    try:
        with open("/proc/meminfo") as f:
            memory = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"logical_cpus": os.cpu_count() or 1, "usable_cpus": usable, "cpu_model": model or platform.processor(),
            "memory_bytes": memory, "system": f"{platform.system()} {platform.release()}"}


def _median_seconds(fn: Callable[[], None], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def memory_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> dict:
    """One core's copy and add throughput on ``nbytes`` buffers (bytes of the buffer per second).

    ``copy``: ``dst[:] = src`` (reads and writes nbytes each). ``add``: ``a += b`` on float32, what a reduction
    does per received byte; its inverse is the cost model's gamma.
    """
    n = nbytes // 4
    src, dst = np.ones(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    copy = _median_seconds(lambda: np.copyto(dst, src), repeats)
    add = _median_seconds(lambda: np.add(dst, src, out=dst), repeats)
    return {"bytes": nbytes, "copy_bytes_per_s": nbytes / copy, "add_bytes_per_s": nbytes / add,
            "gamma": add / nbytes}


def _echo(port_queue, nbytes: int) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port_queue.put(server.getsockname()[1])
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(nbytes)
    view = memoryview(buf)
    while True:
        head = conn.recv(1)
        if not head or head == b"q":
            break
        if head == b"p":          # ping: answer one byte
            conn.sendall(b"p")
        else:                     # bulk: read nbytes, answer one byte
            got = 0
            while got < nbytes:
                got += conn.recv_into(view[got:], nbytes - got)
            conn.sendall(b"k")
    conn.close()
    server.close()


def loopback(nbytes: int = 64 * 2**20, pings: int = 200, repeats: int = 5) -> dict:
    """TCP over 127.0.0.1 between this process and a child: one-way latency (half a 1-byte round trip, median)
    and bandwidth (``nbytes`` sent, then a 1-byte answer; median)."""
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    queue = ctx.Queue()
    child = ctx.Process(target=_echo, args=(queue, nbytes), daemon=True)
    child.start()
    try:
        sock = socket.create_connection(("127.0.0.1", queue.get(timeout=30)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(pings):
            t = time.perf_counter()
            sock.sendall(b"p")
            sock.recv(1)
            rtts.append(time.perf_counter() - t)
        payload = bytes(nbytes)

        def bulk() -> None:
            sock.sendall(b"b")
            sock.sendall(payload)
            sock.recv(1)

        seconds = _median_seconds(bulk, repeats)
        sock.sendall(b"q")
        sock.close()
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()
    return {"latency_s": float(np.median(rtts)) / 2, "bandwidth_bytes_per_s": nbytes / seconds, "bytes": nbytes}
