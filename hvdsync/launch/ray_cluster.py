"""Reaching a Ray cluster before any worker starts: Ray installed, the head's address resolved and answering, the
connection made (with the cluster's token where it wants one: :mod:`hvdsync.launch.ray_auth`), and the job's
workers fitting its live nodes. Each failure is one :class:`~hvdsync.config.ConfigError` line naming what to change.
:mod:`hvdsync.launch.ray` runs the jobs on what these checks let through.
"""
from __future__ import annotations

import contextlib
import logging
import socket
from typing import Iterator

from hvdsync.config import ConfigError
from hvdsync.launch import ray_auth

INSTALL = "pip install 'hvdsync[ray]'"
DEFAULT_PORT = 6379      # `ray start --head`'s default GCS port
CONNECT_TIMEOUT_S = 5    # a head that does not accept a TCP connection in this time is reported, not waited for


def require_ray():
    """The ``ray`` module, or one :class:`ConfigError` line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"ray: Ray is not installed in this environment; install it with {INSTALL}") from None
    return ray


def resolve_address(address: str | None) -> str:
    """``HOST:PORT`` of the Ray head that ``address`` names (``auto``: ``RAY_ADDRESS``, else the cluster the last
    ``ray start`` on this machine joined), checked with one TCP connection; a :class:`ConfigError` line otherwise."""
    address = (address or "auto").strip()
    if address.startswith("ray://"):
        raise ConfigError(f"ray_address: {address!r}: Ray Client (ray://) is not supported (Horovod's rendezvous "
                          "runs in the driver, which the workers must reach); run hvdsync on a node of the cluster "
                          "with --ray auto, e.g. through `ray job submit -- hvdsync train --ray auto ...`")
    if address == "auto":
        # Ray's own lookup (what `ray status` uses): RAY_ADDRESS, the file `ray start` writes, a running GCS.
        from ray._private import services

        try:
            address = services.canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, ValueError) as exc:
            said = str(exc).split(". ")[0].strip()  # Ray's first sentence: none found, or several
            if "Could not find any running Ray instance" in said:
                said = "RAY_ADDRESS is not set and no `ray start` ran on this machine"
            raise ConfigError(f"ray_address: 'auto' found no Ray cluster to join ({said}); start one with "
                              "`ray start --head`, or give the head's HOST:PORT") from None
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = address, str(DEFAULT_PORT)
    if not host or not port.isdigit():
        raise ConfigError(f"ray_address: {address!r} is not allowed; expected HOST:PORT of the Ray head "
                          f"(`ray start --head` prints it) or 'auto'")
    probe(host, int(port))
    return f"{host}:{port}"


def probe(host: str, port: int) -> None:
    # One TCP connection to the head's GCS port: ray.init() to an address where nothing answers retries for a
    # minute or more before it says so; this says it in seconds, naming the address.
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return
    except socket.gaierror as exc:
        raise ConfigError(f"ray_address: {host!r} does not resolve to an address ({exc.strerror}); check the name, "
                          "or give the head's IP address") from None
    except ConnectionRefusedError:
        raise ConfigError(f"ray_address: nothing listens at {host}:{port} (connection refused); start the head "
                          f"there (`ray start --head --port {port}`) or give the address it printed") from None
    except OSError as exc:
        why = f"no answer in {CONNECT_TIMEOUT_S} s" if isinstance(exc, TimeoutError) else exc.strerror
        raise ConfigError(f"ray_address: {host}:{port} does not answer ({why}); check that the Ray head is up "
                          "and reachable from this machine") from None


@contextlib.contextmanager
def connected(ray, address: str, quiet: bool) -> Iterator[None]:
    """Connect this process to the cluster for the job, unless the caller already did (a notebook's ``ray.init``:
    used as it is and left open)."""
    if ray.is_initialized():
        yield
        return
    with ray_auth.authenticated(address):  # a token where the cluster wants one, or one line saying what is wrong
        # log_to_driver: the workers' output comes here only when asked (--verbose); it is always in Ray's logs of
        # each node (<temp dir>/session_latest/logs/worker-*.out), and a failed rank's traceback comes with its error.
        ray.init(address=address, log_to_driver=not quiet, logging_level=logging.WARNING)
        try:
            yield
        finally:
            ray.shutdown()


def alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def check_capacity(ray, address: str, np: int, cpus_per_worker: float, gpus_per_worker: float,
                   field: str = "np") -> None:
    """:class:`ConfigError` where ``np`` workers of ``cpus_per_worker`` CPUs (and ``gpus_per_worker`` GPUs) cannot
    all be placed on the cluster's live nodes, counted as Horovod's elastic discovery counts them: whole workers
    per node."""
    nodes = alive_nodes(ray)
    for resource, each in (("CPU", cpus_per_worker), ("GPU", gpus_per_worker)):
        if not each:
            continue
        fits = sum(int(n["Resources"].get(resource, 0) // each) for n in nodes)
        if np > fits:
            total = sum(n["Resources"].get(resource, 0) for n in nodes)
            each_node = ", ".join(f"{n['NodeManagerAddress']}: {n['Resources'].get(resource, 0):g}" for n in nodes)
            raise ConfigError(f"{field}: {np} workers of {each:g} {resource} each do not fit the Ray cluster at "
                              f"{address}: its {len(nodes)} nodes have {total:g} {resource}s ({each_node}), room "
                              f"for {fits}; lower {field}, or add nodes (`ray start --address {address}`)")


def node_names(ray) -> dict[str, str]:
    """A short unique name for each live node (its host name, else its address), by node id: Horovod's static Ray
    adapter names the workers' host by node id (56 hex digits), which is what MLflow's ``hosts`` would show."""
    nodes = alive_nodes(ray)
    hostnames = [n["NodeManagerHostname"] for n in nodes]
    addresses = [n["NodeManagerAddress"] for n in nodes]
    names = {}
    for n in nodes:
        name, address = n["NodeManagerHostname"], n["NodeManagerAddress"]
        names[n["NodeID"]] = (name if hostnames.count(name) == 1 else address if addresses.count(address) == 1
                              else f"{address}/{n['NodeID'][:8]}")
    return names
