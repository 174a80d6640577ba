"""train.keep_freed_memory: glibc's malloc told to keep what a step frees, unless the environment chose the
allocator; and the page faults it removes, counted in a real process."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.train import runtime
from hvdsync.core.train.runtime import keep_freed_memory


class RecordingLibc:
    """A C library with glibc's two entry points, recording every mallopt call."""

    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def gnu_get_libc_version(self):
        return b"2.36"

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.result


def test_both_thresholds_are_fixed_on_glibc():
    libc = RecordingLibc()
    assert keep_freed_memory({}, libc) == "applied"
    assert sorted(libc.calls) == sorted([(runtime._M_MMAP_THRESHOLD, 32 << 20), (runtime._M_TRIM_THRESHOLD, 1 << 30)])


@pytest.mark.parametrize("environ", [{"MALLOC_TRIM_THRESHOLD_": "0"}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
                                     {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
                                     {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}])
def test_an_allocator_chosen_in_the_environment_is_left_alone(environ):
    libc = RecordingLibc()
    assert keep_freed_memory(environ, libc) == "environment"
    assert libc.calls == []


def test_a_c_library_without_glibcs_functions_is_left_alone():
    class Musl:
        def mallopt(self, param, value):
            raise AssertionError("must not be called")

    assert keep_freed_memory({}, Musl()) == "not glibc"
    assert keep_freed_memory({}, RecordingLibc(result=0)) == "not glibc"


def test_the_field_is_checked_by_name():
    assert Config().train.keep_freed_memory is True
    with pytest.raises(ConfigError, match="train.keep_freed_memory"):
        Config.from_dict({"train": {"keep_freed_memory": "yes"}})


# Frees two 16 MiB blocks at the heap's top (more than twice the block: glibc then trims it back to the system),
# allocates them again, and counts the minor page faults of that second round.
FAULTS = """
import ctypes, resource, sys
from hvdsync.core.train.runtime import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory({}) == "applied"
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 16 << 20
def touch(p):
    ctypes.memset(p, 1, size)
first = [libc.malloc(size) for _ in range(3)]
for p in first: touch(p)
for p in first: libc.free(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
again = [libc.malloc(size) for _ in range(3)]
for p in again: touch(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_is_not_faulted_in_again():
    import os

    from hvdlab.bench.link_fair import same_allocator

    def faults(mode: str, env: dict | None = None) -> int:
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True,
                             env={**os.environ, **(env or {})})
        return int(out.stdout.strip())

    pages = 3 * (16 << 20) // 4096
    assert faults("default") > pages // 2   # glibc's defaults: the blocks come back as fresh pages
    assert faults("keep") < 100             # kept: the same pages, already there
    assert faults("default", same_allocator()) < 100   # the benchmarks' environment: the same, set by glibc


def test_benchmarks_give_every_contender_the_same_setting():
    """What the comparisons put in every contender's environment is what the workers' own call sets, and a worker
    started with it leaves the allocator alone."""
    from hvdlab.bench.link_fair import same_allocator

    env = same_allocator()
    assert env == {"MALLOC_MMAP_THRESHOLD_": str(runtime.MMAP_THRESHOLD_BYTES),
                   "MALLOC_TRIM_THRESHOLD_": str(runtime.KEEP_FREED_BYTES)}
    libc = RecordingLibc()
    assert keep_freed_memory(env, libc) == "environment" and libc.calls == []
