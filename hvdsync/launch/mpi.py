"""Which controllers the installed Horovod has (Gloo, MPI), which MPI is on this machine, and which of Slurm's MPI
plugins that MPI can take its ranks from. Read from the binaries and the MPI's own tools: no framework is imported
(``hvdsync doctor``, and the checks of a task under ``srun``: :mod:`hvdsync.launch.slurm`)."""
from __future__ import annotations

import re
import shutil
import subprocess

# Open MPI's components (``ompi_info``'s mca:pmix:<name>) that speak each kind of Slurm MPI plugin: PMIx (ext3x: an
# external PMIx library, what Debian builds; pmix3x: Open MPI's own copy), PMI-2 (s2) and PMI-1 (s1).
_SPEAKS = {"pmix": re.compile(r"^(ext|pmix)[0-9]+x$"), "pmi2": re.compile(r"^s2$"), "pmi1": re.compile(r"^s1$")}


def _output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def mpi_version() -> str | None:
    """The MPI whose ``mpirun`` is on PATH, e.g. ``Open MPI 4.1.4`` or ``MPICH 4.0.2``; None without one."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    banner = _output([mpirun, "--version"])
    match = re.search(r"\(Open MPI\) ([0-9][0-9.a-z]*)", banner)
    if match:
        return f"Open MPI {match[1]}"
    match = re.search(r"^\s*Version:\s*([0-9][0-9.a-z]*)", banner, re.M) if "HYDRA" in banner else None
    return f"MPICH {match[1]}" if match else f"unknown ({mpirun})"


def mpi_speaks(ompi_info: str | None = None) -> set[str] | None:
    """The kinds of Slurm MPI plugin (pmix, pmi2, pmi1) this machine's Open MPI can take its ranks from, from its
    ``ompi_info``; None where that cannot be told (another MPI, or no ``ompi_info`` on PATH)."""
    ompi_info = ompi_info or shutil.which("ompi_info")
    if not ompi_info:
        return None
    components = {line.split(":")[2] for line in _output([ompi_info, "--parsable"]).splitlines()
                  if line.startswith("mca:pmix:")}
    return {kind for kind, pattern in _SPEAKS.items() if any(pattern.match(c) for c in components)}


def controllers() -> dict[str, str]:
    """``hvdsync doctor``'s lines: the installed Horovod's controllers, the MPI here, and how to start an MPI job."""
    from hvdsync.launch.base import gloo_built, mpi_built

    built = [name for name, ok in (("Gloo", gloo_built()), ("MPI", mpi_built())) if ok]
    version = mpi_version()
    lines = {"controllers": ", ".join(built) or "none (Horovod missing)"}
    if "MPI" in built:
        speaks = mpi_speaks()
        lines["mpi"] = (f"{version or 'no mpirun on PATH'}; start with mpirun, horovodrun --mpi or srun "
                        f"{' or '.join(f'--mpi={k}' for k in sorted(speaks)) if speaks else '--mpi=<PMI plugin>'}")
    else:
        fix = ("rebuild Horovod: bash scripts/build_horovod.sh (the MPI found enters its key)" if version else
               "apt-get install openmpi-bin libopenmpi-dev, then bash scripts/build_horovod.sh")
        lines["mpi"] = f"not built in (mpirun and srun cannot start this Horovod; {version or 'no MPI on PATH'}): {fix}"
    return lines
