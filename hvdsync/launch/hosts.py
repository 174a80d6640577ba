"""Host lists for multi-host jobs: Horovod's ``-H`` and hostfile syntax, Slurm node lists, and the checks that run
before any worker starts. No ssh, no connections; the one lookup (this machine's own name) is injectable. Every error
is one ConfigError line that names the entry, line or variable and says what is allowed.
"""
from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from hvdsync.config import ConfigError

# Horovod 0.28.1 (runner/common/util/hosts.py, parse_hosts_and_slots) accepts exactly `[\w.-]+:[0-9]+` per entry:
# names of word characters, dots and dashes (so IPv4 addresses, never IPv6, whose colons it would split on).
_NAME = r"[\w.-]+"
_ENTRY = re.compile(rf"({_NAME})(?::([0-9]+))?")
_SLOTS = re.compile(r"slots=([0-9]+)")
_HOSTFILE_FORM = "expected '<host> slots=<N>' per line ('#' starts a comment)"
# Slurm's own limit on one job (MAX_SLURM_NODES): a bigger expansion is a typo, not a cluster.
MAX_NODES = 65536
# A token of a Slurm node list: Slurm splits on commas and whitespace except inside brackets ("a[1,3],b": two tokens).
_TOKEN = re.compile(r"(?:\[[^\[\]{}]*\]|[^\[\]{}, \t\n])+")


@dataclass(frozen=True)
class Host:
    """One host of a job and the number of worker processes (slots) it may run."""

    name: str
    slots: int = 1

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def _host(name: str, slots: str | None, where: str) -> Host:
    # A leading '-' would reach ssh as an option; 0 slots gives a host that Horovod still ssh-checks but never uses.
    if name.startswith("-"):
        raise ConfigError(f"{where}: host name {name!r} starts with '-'; use the host's real name or address")
    if slots is not None and int(slots) < 1:
        raise ConfigError(f"{where}: host {name!r} has {int(slots)} slots; give it at least 1 or leave it out")
    return Host(name, 1 if slots is None else int(slots))


def check_duplicates(hosts: list[Host], source: str = "hosts", where: Callable[[int], str] | None = None) -> list[Host]:
    """Refuse a host listed twice: Horovod would give both entries the same local ranks on one machine."""
    where = where or (lambda i: f"entry {i + 1}")
    first: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if host.name in first:
            raise ConfigError(f"{source}: host {host.name!r} at {where(i)} is already at {where(first[host.name])}; "
                              "list each host once with all its slots")
        first[host.name] = i
    return hosts


def parse_hosts(text: str, source: str = "--hosts") -> list[Host]:
    """Parse Horovod's ``-H`` syntax ``"a:2,b:2"``; a name without ``:N`` gets 1 slot (as mpirun's ``-H`` does).
    Spaces around entries are ignored, as Horovod strips them; ``source`` is the option that messages name."""
    hosts = []
    for i, entry in enumerate(text.split(","), 1):
        entry = entry.strip()
        match = _ENTRY.fullmatch(entry)
        if not match:
            problem = "is empty" if not entry else f"{entry!r} is not allowed"
            raise ConfigError(f"{source}: entry {i} {problem}; expected host:slots entries separated by commas, "
                              "e.g. a:2,b:2 (names: letters, digits, '_', '.', '-'; IPv4 addresses, not IPv6)")
        hosts.append(_host(match[1], match[2], f"{source} entry {i}"))
    return check_duplicates(hosts, source)


def parse_hostfile(text: str, source: str = "<hostfile>") -> list[Host]:
    """Parse Horovod's hostfile syntax, one ``<host> slots=<N>`` per line, plus ``#`` comments and blank lines.

    Horovod 0.28.1's reader (``parse_host_files``) takes the first word as the host and what follows the first '='
    as the slots: a blank line, a comment or a line without '=' is an IndexError there, and any ``key=N`` is read as
    the slots. Its ``<host> slots=<N>`` lines give the same hosts here; anything else is refused with its line.
    """
    hosts, lines = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, line {number}"
        words = line.split()
        slots = _SLOTS.fullmatch(words[1]) if len(words) == 2 else None
        if slots is None or not re.fullmatch(_NAME, words[0]):
            # One word: Open MPI would take the host's core count, Horovod fails; another key: Horovod misreads it.
            hint = ("the host:slots form belongs to --hosts" if ":" in line else "the slots are missing",
                    f"{words[-1]!r} is not slots=<N> (no other key is read)" if slots is None
                    else "host names are letters, digits, '_', '.' and '-'",
                    f"{len(words)} words, where a line has two")[min(len(words), 3) - 1]
            raise ConfigError(f"{where}: {line!r}: {hint}; {_HOSTFILE_FORM}")
        hosts.append(_host(words[0], slots[1], where))
        lines.append(number)
    if not hosts:
        raise ConfigError(f"{source}: no hosts in the file; {_HOSTFILE_FORM}")
    return check_duplicates(hosts, source, lambda i: f"line {lines[i]}")


def read_hostfile(path: str | os.PathLike[str]) -> list[Host]:
    """Read a hostfile (see :func:`parse_hostfile`); messages name the file and the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        line = error.object[:error.start].count(b"\n") + 1
        raise ConfigError(f"--hostfile: {str(path)!r}, line {line}: byte {error.object[error.start]:#04x} (at offset "
                          f"{error.start}) is not UTF-8 ({error.reason}); a hostfile is text, one '<host> slots=<N>' "
                          "per line") from None
    except OSError as error:
        raise ConfigError(f"--hostfile: {str(path)!r} cannot be read ({error.strerror or error}); "
                          "give the path of a file with one '<host> slots=<N>' per line") from None
    return parse_hostfile(text, source=str(path))


def to_horovod(hosts: Iterable[Host]) -> str:
    """The ``-H`` string Horovod's runner takes: always ``name:slots``, because Horovod 0.28.1 rejects a bare name."""
    return ",".join(str(host) for host in hosts)


# --- Slurm ---------------------------------------------------------------------------------------------------------

def _numbers(group: str, token: str, variable: str) -> list[str]:
    # One bracket group, e.g. "01-04,07". Slurm pads every number to the width of the range's low end as written:
    # [01-10] gives 01..10, [1-10] gives 1..10, [001-3] gives 001..003.
    numbers: list[str] = []
    for part in group.split(","):
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part)
        if not match or int(match[1]) > int(match[2] or match[1]) or int(match[2] or 0) - int(match[1]) >= MAX_NODES:
            raise ConfigError(f"{variable}: range {part!r} in {token!r} is not allowed; expected a number or "
                              f"lo-hi with lo <= hi and at most {MAX_NODES} hosts, e.g. node[01-04,07]")
        numbers += [f"{n:0{len(match[1])}d}" for n in range(int(match[1]), int(match[2] or match[1]) + 1)]
    return numbers


def _prefixes(parts: list[str], groups: list[list[str]]) -> Iterator[str]:
    # Slurm (hostlist.c, _push_range_list) fills the prefix's groups from its LAST group outward, recursing into
    # the earlier ones: with three groups the middle one varies slowest. Kept, so the order is scontrol's.
    if not groups:
        yield parts[0]
        return
    for number in groups[-1]:
        yield from _prefixes(parts[:-2] + [parts[-2] + number + parts[-1]], groups[:-1])


def expand_nodelist(text: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm node list into host names, in the order ``scontrol show hostnames`` prints them:
    ``"node[01-02],gpu5,rack[1-2]-n[1-2]"`` gives node01, node02, gpu5, rack1-n1, rack1-n2, rack2-n1, rack2-n2."""
    stray = re.sub(_TOKEN, "", text).strip(", \t\n")
    if stray:  # Slurm does not nest brackets; "{...}" expressions need its controller
        raise ConfigError(f"{variable}: {text!r} has {stray[0]!r} out of place (brackets pair up and do not nest); "
                          "expected names and bracket ranges such as node[01-04,07],gpu5")
    names: list[str] = []
    for token in _TOKEN.findall(text):
        pieces = re.split(r"\[([^\]]*)\]", token)  # literal, group, literal, ..., group, suffix
        groups = [_numbers(group, token, variable) for group in pieces[1::2]]
        if len(names) + math.prod(len(group) for group in groups) > MAX_NODES:
            raise ConfigError(f"{variable}: {text!r} expands to more than {MAX_NODES} hosts, Slurm's limit")
        if not groups:
            names.append(token)
            continue
        for prefix in _prefixes(pieces[0:-1:2], groups[:-1]):
            names += [prefix + number + pieces[-1] for number in groups[-1]]
    if not names:
        raise ConfigError(f"{variable}: {text!r} names no hosts")
    return names


def tasks_per_node(text: str, n_nodes: int, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slots per node from Slurm's ``2(x3),1`` (three nodes with 2, then one with 1); one number is every node's."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", item.strip())
        if not match or int(match[1]) < 1 or int(match[2] or 1) < 1:
            raise ConfigError(f"{variable}: {item.strip()!r} in {text!r} is not allowed; expected counts of at "
                              "least 1, each optionally followed by (x<repeats>), e.g. 2(x3),1")
        counts += [int(match[1])] * int(match[2] or 1)
    if len(counts) == 1 and "(" not in text:
        return counts * n_nodes
    if len(counts) != n_nodes:
        raise ConfigError(f"{variable}: {text!r} describes {len(counts)} nodes but the node list has {n_nodes}")
    return counts


def slurm_hosts(environ: Mapping[str, str] = os.environ) -> list[Host]:
    """The hosts of the Slurm allocation this runs in: ``SLURM_JOB_NODELIST``, with the tasks per node as slots from
    ``SLURM_TASKS_PER_NODE`` (always set in an allocation, one count per node), else ``SLURM_NTASKS_PER_NODE`` (set
    only with ``--ntasks-per-node``); the two agree when both are set."""
    node_var = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(v, "").strip()), None)
    task_var = next((v for v in ("SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE") if environ.get(v, "").strip()), None)
    if node_var is None or task_var is None:
        missing = ("SLURM_JOB_NODELIST (or SLURM_NODELIST)" if node_var is None
                   else "SLURM_TASKS_PER_NODE (or SLURM_NTASKS_PER_NODE)")
        raise ConfigError(f"{missing}: not set; run inside a Slurm allocation (sbatch or salloc) or give --hosts")
    names = expand_nodelist(environ[node_var], node_var)
    slots = tasks_per_node(environ[task_var], len(names), task_var)
    bad = [name for name in names if not re.fullmatch(_NAME, name)]
    if bad:
        raise ConfigError(f"{node_var}: node {bad[0]!r} is not a name Horovod accepts (letters, digits, '_.-')")
    hosts = [Host(name, count) for name, count in zip(names, slots)]
    return check_duplicates(hosts, node_var, lambda i: f"node {i + 1}")


# --- checks before any worker starts -------------------------------------------------------------------------------

def check_slots(hosts: list[Host], np: int) -> None:
    """Refuse a job that asks for more processes than the hosts have slots (Horovod would fail after ssh)."""
    total = sum(host.slots for host in hosts)
    if np < 1 or not hosts:
        raise ConfigError(f"np: {np} processes on {len(hosts)} hosts is not allowed; give at least 1 of each")
    if np > total:
        raise ConfigError(f"np: {np} processes asked but the hosts have {total} slots ({to_horovod(hosts)}); "
                          f"lower -np to {total} or give the hosts more slots")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def loopback_problem(hosts: list[Host], *, hostname: str | None = None,
                     resolve: Callable[[str], str] = socket.gethostbyname,
                     local_names: Iterable[str] = ()) -> str | None:
    """Why a multi-host job would die in Gloo with ``connect [127.0.0.1]``, or None when it would not.

    When this machine's host name resolves to loopback (Debian and Ubuntu write ``127.0.1.1 <hostname>`` into
    /etc/hosts), Gloo peers are told to dial loopback and reach themselves; ``--network-interface`` does not help
    (measured), mapping the name does. A job is multi-host when it lists two or more hosts, not all of them this
    machine (localhost, a loopback address, the host name, or one of ``local_names``, e.g. this machine's addresses).
    Returned, not raised: a launch from a machine that runs no worker may choose to warn only.
    """
    hostname = socket.gethostname() if hostname is None else hostname
    local = {"localhost", hostname, hostname.split(".")[0], *local_names}
    remote = [host.name for host in hosts if host.name not in local and not _is_loopback(host.name)]
    if not remote or len({host.name for host in hosts}) < 2:
        return None
    try:
        address = resolve(hostname)
    except OSError:
        return None  # an unresolvable name is another check's business (an unreachable host)
    if not _is_loopback(address):
        return None
    return (f"host name {hostname!r} of this machine resolves to {address} (loopback) but the job also runs on "
            f"{', '.join(remote)}: Gloo peers would dial {address} and fail with 'gloo::IoException ... connect "
            f"[{address}]'. On every host, map its host name to the address of the interface the job uses in "
            f"/etc/hosts (e.g. '<that address> {hostname}' instead of '{address} {hostname}'); "
            "--network-interface alone does not fix this")



def same_host_twice(hosts: list[Host], local: set[str] | None = None) -> str | None:
    """A note when two entries of a static host list name one machine (``localhost`` and ``127.0.0.1``, or a name
    and its address), else None. Horovod counts local ranks per entry, so both entries' ranks start at local rank 0
    on that machine; it runs, but two ranks then share local rank 0 (and its GPU, where GPUs are used).
    ``local``: this machine's addresses (every loopback address counts as this machine too)."""
    seen: dict[str, str] = {}
    for host in hosts:
        try:
            address = socket.gethostbyname(host.name)
        except OSError:
            continue  # an unresolvable name is the reachability check's business
        machine = "this machine" if _is_loopback(address) or address in (local or set()) else address
        if machine in seen:
            return (f"hosts: {seen[machine]!r} and {host.name!r} are the same machine ({machine}); list it once "
                    f"with all its slots ({seen[machine]}:N)")
        seen[machine] = host.name
    return None
