"""The rate a TCP stream actually gets through the test hosts' link: the cost model's ``beta`` at every rate,
including ``none`` (no ``tbf``: then a veth pair, bounded by the CPU copying through the kernel).

    python -m hvdlab.bench.link_probe serve PORT       # on node2: receives until the sender closes, prints bytes
    python -m hvdlab.bench.link_probe send HOST PORT N # on node1: sends N bytes, prints seconds until node2 has them
"""
from __future__ import annotations

import socket
import sys
import time

CHUNK = 1 << 20


def serve(port: int) -> int:
    with socket.create_server(("0.0.0.0", port)) as srv:
        print("ready", flush=True)
        conn, _ = srv.accept()
        with conn:
            got = 0
            while chunk := conn.recv(CHUNK):
                got += len(chunk)
            print(got, flush=True)
    return 0


def send(host: str, port: int, n: int) -> float:
    """Seconds to move ``n`` bytes: the clock stops when the receiver has read them all (its close)."""
    buf = b"\0" * CHUNK
    for _ in range(50):   # the receiver may still be starting
        try:
            conn = socket.create_connection((host, port), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise RuntimeError(f"link probe: nothing listens on {host}:{port}")
    with conn:
        t0 = time.perf_counter()
        for at in range(0, n, CHUNK):
            conn.sendall(buf[: min(CHUNK, n - at)])
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)   # returns b"" once the receiver has read everything and closed
        return time.perf_counter() - t0


def bytes_per_second(cluster, bits: float | None, cwd, port: int = 29611) -> float:
    """Bytes/s of one TCP stream node1 -> node2 (about half a second of traffic at the nominal ``bits``/s; 256 MB
    without a limit)."""
    n = int(min(256e6, bits / 8 * 0.5)) if bits else int(256e6)
    server = cluster.popen("node2", [sys.executable, "-m", __name__, "serve", str(port)], stdout=-1, text=True,
                            cwd=cwd)
    try:
        server.stdout.readline()
        out = cluster.run("node1", [sys.executable, "-m", __name__, "send", cluster.host("node2").address,
                                    str(port), str(n)], cwd=cwd)
        if out.returncode != 0:
            raise RuntimeError(f"link probe failed: {out.stderr[-500:]}")
        return n / float(out.stdout.split()[-1])
    finally:
        server.wait(timeout=30)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(serve(int(sys.argv[2])))
    print(send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
