"""Build hvdsync's Docker images: ``make docker-cpu`` / ``make docker-gpu-torch`` / ``make docker-gpu-tf``
(``python3 docker/build.py cpu|gpu-torch|gpu-tf``; ``gpu`` is ``gpu-torch``, the GPU image's old name).

What it adds to a plain ``docker build``:

- **A base image without a registry.** The Dockerfiles' default bases are public images (``python:3.11-slim-bookworm``,
  ``nvidia/cuda:...``). Where they cannot be pulled, it makes a Debian 12 base from Debian's package archive
  (``docker/make_base.sh``: debootstrap + ``docker import``) and builds on that. ``gpu-tf`` needs a CUDA 12 compiler,
  which PyPI does not have: its local bases are Debian 13, the builder's with Debian's CUDA 12.4 toolkit (non-free).
- **This machine's pip settings, without baking them in.** pip's configuration (``pip config list``: files and
  ``PIP_*`` variables) enters the build as build arguments of the builder stage (index URLs, find-links) and BuildKit
  secrets (the CA bundle ``cert`` names, a constraints file), so no layer of the final image holds them. Local
  find-links folders and ``file://`` indexes are served over HTTP on 127.0.0.1 for the build's duration (the build
  uses the host network, so it reaches them, and PyPI through the host's route).
- **The Horovod wheel cache.** ``scripts/build_horovod.sh`` caches wheels under ``~/.cache/hvdsync/horovod`` by a key of
  what they were built against; that folder goes into the build as a small image (``HOROVOD_CACHE``), so an image
  whose key matches a wheel built here installs it instead of compiling Horovod again.

Usage::

    python3 docker/build.py cpu                    # -> hvdsync:cpu
    python3 docker/build.py gpu-torch              # -> hvdsync:gpu-torch and hvdsync:gpu (NCCL, CUDA 13; no GPU needed)
    python3 docker/build.py gpu-tf                 # -> hvdsync:gpu-tf (TensorFlow with NCCL on CUDA 12)
    python3 docker/build.py gpu-tf --plan          # what it would run, without Docker
    DOCKER=/path/to/docker python3 docker/build.py cpu   # a docker client with BuildKit (buildx, or docker <= 22)

It prints the build time and the image size at the end (``docker/README.md`` records the last figures).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_BASE = "hvdsync-base:bookworm"
# The bases this script can make from Debian's archive (docker/make_base.sh TAG SUITE PACKAGES...), by tag.
LOCAL_RECIPES = {
    LOCAL_BASE: ("bookworm", ()),
    # TensorFlow's GPU image: PyPI has no CUDA 12 compiler, Debian 13 has one (nvidia-cuda-toolkit 12.4, non-free).
    # Its Python is 3.13, so the final stage runs on Debian 13 too (the venv moves between the stages).
    "hvdsync-base:trixie-cuda12": ("trixie", ("nvidia-cuda-toolkit",)),
    "hvdsync-base:trixie": ("trixie", ()),
}
# Where pip's local folders are served during a build (HVDSYNC_DOCKER_PORT overrides).
LOCAL_PORT = int(os.environ.get("HVDSYNC_DOCKER_PORT", "47321"))
# Each image: its Dockerfile, its build arguments, its tags and its public bases by build argument (the GPU images
# build on CUDA's devel image and run on its runtime image, each with its framework's CUDA: torch 2.13.0 is built
# for CUDA 13, TensorFlow 2.21 for CUDA 12; Dockerfile.gpu says why they are two images).
VARIANTS = {
    "cpu": {"dockerfile": "Dockerfile.cpu", "args": {}, "tags": ["hvdsync:cpu"],
            "bases": {"BASE_IMAGE": "python:3.11-slim-bookworm"}},
    "gpu-torch": {"dockerfile": "Dockerfile.gpu", "args": {"FRAMEWORK": "torch"},
                  "tags": ["hvdsync:gpu-torch", "hvdsync:gpu"],
                  "bases": {"BUILD_IMAGE": "nvidia/cuda:13.0.1-devel-ubuntu24.04",
                            "BASE_IMAGE": "nvidia/cuda:13.0.1-runtime-ubuntu24.04"}},
    "gpu-tf": {"dockerfile": "Dockerfile.gpu", "args": {"FRAMEWORK": "tensorflow"}, "tags": ["hvdsync:gpu-tf"],
               "bases": {"BUILD_IMAGE": "nvidia/cuda:12.9.1-devel-ubuntu24.04",
                         "BASE_IMAGE": "nvidia/cuda:12.9.1-runtime-ubuntu24.04"},
               "local_bases": {"BUILD_IMAGE": "hvdsync-base:trixie-cuda12", "BASE_IMAGE": "hvdsync-base:trixie"}},
}
# `gpu` was the one GPU image (torch with NCCL, TensorFlow on the CPU): it is now the torch image, and that image is
# tagged hvdsync:gpu too, so `make docker-gpu` and `docker run hvdsync:gpu ...` keep working.
ALIASES = {"gpu": "gpu-torch"}
DEFAULT_BASES = {name: v["bases"] for name, v in VARIANTS.items()}
# Variants whose builder needs a CUDA compiler that pip cannot install, so the local Debian 12 base (no CUDA) cannot
# build them. gpu-torch's CUDA 13 nvcc comes from PyPI there (scripts/cuda-build-requirements.txt); TensorFlow's CUDA 12
# has none on PyPI: nvidia-cuda-nvcc-cu12 holds only ptxas (the wheel's file list; NVIDIA/cuda-python issue #2100).
# Asked for by --base, it is refused before anything is built; without --base, gpu-tf's own local bases serve.
NO_PIP_COMPILER = {"gpu-tf": ("CUDA 12", "nvidia-cuda-nvcc-cu12 holds only ptxas")}
# pip settings that become build arguments (pip reads PIP_<NAME> from the environment of the builder's RUN steps).
ARG_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "default-timeout")
# pip settings that name a local file: BuildKit secrets, mounted only into the RUN steps that call pip.
SECRET_KEYS = {"cert": "pip_cert", "constraint": "pip_constraint"}


class BuildError(SystemExit):
    def __init__(self, message: str):
        super().__init__(f"docker/build.py: error: {message}")


def say(message: str) -> None:
    print(f"[docker] {message}", file=sys.stderr, flush=True)


def docker_cmd() -> list[str]:
    """The docker client, checked: an engine answers, and the client can build with BuildKit (secrets, mounts)."""
    docker = os.environ.get("DOCKER", "docker")
    if not shutil.which(docker):
        raise BuildError(f"no docker client ('{docker}' not found): install Docker (Debian: apt-get install docker.io; "
                         "elsewhere https://docs.docker.com/engine/install/) and start its engine (dockerd)")
    if subprocess.run([docker, "info"], capture_output=True).returncode != 0:
        raise BuildError(f"no Docker engine answers ('{docker} info' failed): start it (systemctl start docker, or "
                         "run dockerd as root; Debian: apt-get install docker.io) and check you may use its socket")
    if subprocess.run([docker, "buildx", "version"], capture_output=True).returncode != 0:
        # Without the buildx plugin, clients up to 22.x still build with BuildKit when asked; newer ones refuse.
        os.environ["DOCKER_BUILDKIT"] = "1"
        probe = subprocess.run([docker, "build", "--help"], capture_output=True, text=True)
        if "--secret" not in probe.stdout:
            raise BuildError(f"'{docker} build' cannot use BuildKit (needed for build secrets): install the buildx "
                             "plugin (https://docs.docker.com/go/buildx/), or set DOCKER= to a client that has it")
    return [docker]


def image_exists(docker: list[str], image: str) -> bool:
    return subprocess.run(docker + ["image", "inspect", image], capture_output=True).returncode == 0


def refuse_local_base(variant: str, build_image: str) -> None:
    """Stop, in one line, where ``variant`` would build on the local Debian 12 base without a compiler it can get."""
    if variant in NO_PIP_COMPILER and build_image == LOCAL_BASE:
        cuda, wheel = NO_PIP_COMPILER[variant]
        raise BuildError(f"{variant} cannot be built on {LOCAL_BASE}, the local Debian 12 base: it has no {cuda} "
                         f"compiler (nvcc), and PyPI has none ({wheel}); build without --base (where "
                         f"{DEFAULT_BASES[variant]['BUILD_IMAGE']} cannot be pulled, on Debian 13 bases made here, "
                         f"with Debian's CUDA 12.4 toolkit), or give an image with {cuda}'s nvcc: --base IMAGE "
                         "(docker build: --build-arg BUILD_IMAGE=IMAGE)")


def resolve_bases(docker: list[str], wanted: str | None, variant: str) -> dict[str, str]:
    """The base image(s) to build on, by build argument: the one asked for, else the public defaults if they can be
    pulled, else Debian bases made here (the variant's ``local_bases``, else Debian 12 for every stage: the venv
    moves between the stages, so their Python must agree)."""
    defaults = DEFAULT_BASES[variant]
    if wanted:
        return {arg: wanted for arg in defaults}
    for image in defaults.values():
        if image_exists(docker, image):
            continue
        say(f"pulling {image}")
        if subprocess.run(docker + ["pull", "-q", image], capture_output=True, timeout=1800).returncode != 0:
            break
    else:
        return dict(defaults)
    local = VARIANTS[variant].get("local_bases") or {arg: LOCAL_BASE for arg in defaults}
    say(f"{image} cannot be pulled (no registry reachable): building on {', '.join(sorted(set(local.values())))}, "
        "made from Debian packages")
    for tag in dict.fromkeys(local.values()):
        if not image_exists(docker, tag):
            suite, packages = LOCAL_RECIPES[tag]
            subprocess.run(["bash", str(ROOT / "docker" / "make_base.sh"), tag, suite, *packages], check=True,
                           env={**os.environ, "DOCKER": docker[0]})
    return dict(local)


def pip_settings() -> dict[str, str]:
    """pip's effective global settings: its config files, overridden by PIP_* variables (as pip itself does)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, str] = {}
    from_env: set[str] = set()
    for line in out.splitlines():
        m = re.fullmatch(r"([^.]*)\.([\w-]+)='(.*)'", line.strip())
        if not m or m.group(1) not in (":env:", "global", "install"):
            continue
        section, key, value = m.groups()
        if key in from_env:
            continue
        found[key] = value
        if section == ":env:":
            from_env.add(key)
    return found


class LocalServer:
    """Serves local folders over HTTP on 127.0.0.1 while the build runs (pip in the build reaches them there)."""

    def __init__(self, port: int = LOCAL_PORT) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hvdsync-docker-srv-"))
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        # A fixed port: its URL is part of the pip build arguments, which are part of the cache key of the dependency
        # step. A random port would re-run that step (10+ minutes) on every build.
        try:
            self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:
            say(f"port {port} is taken: serving pip's local folders on another one (the dependency step re-runs)")
            self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.count = 0

    def publish(self, folder: Path) -> str:
        link = self.root / str(self.count)
        self.count += 1
        link.symlink_to(folder.resolve())
        return f"{self.url}/{link.name}"

    def __enter__(self) -> "LocalServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        shutil.rmtree(self.root, ignore_errors=True)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _as_url(item: str, server: LocalServer, index: bool) -> str:
    """A pip location usable inside the build: remote URLs as they are; local folders served by ``server``."""
    path = item[len("file://"):] if item.startswith("file://") else item if item.startswith("/") else None
    if path is None:
        return item
    folder = Path(path)
    if index:
        # A file:// "simple" index usually links its files as ../../files/...: serve its parent so they resolve.
        return f"{server.publish(folder.parent)}/{folder.name}/"
    return f"{server.publish(folder)}/"


def pip_build_options(server: LocalServer) -> list[str]:
    """docker build options carrying pip's settings: --build-arg for URLs, --secret for local files."""
    options: list[str] = []
    # Sorted: the served URLs are numbered in this order, and pip lists settings in the environment's order.
    for key, value in sorted(pip_settings().items()):
        if key in ARG_KEYS:
            items = [_as_url(v, server, index=key.endswith("index-url")) if key != "default-timeout" and
                     key != "trusted-host" else v for v in value.split()]
            options += ["--build-arg", f"PIP_{key.upper().replace('-', '_')}={' '.join(items)}"]
        elif key in SECRET_KEYS and Path(value).is_file():
            options += ["--secret", f"id={SECRET_KEYS[key]},src={value}"]
    return options


def _fits(wheel: Path, variant: str) -> bool:
    """Whether a cached wheel can serve ``variant``: Gloo-only builds for the CPU image; for a GPU image, NCCL builds
    of exactly its framework (by the key beside it; a wheel without one is passed to every image)."""
    variant = ALIASES.get(variant, variant)
    path = wheel.parent / "KEY"
    if not path.exists():
        return True
    key = path.read_text()
    if ("-nccl" in key) != (variant != "cpu"):
        return False
    built = {"torch": bool(re.search(r"-torch\d", key)), "tensorflow": bool(re.search(r"-(tf|tensorflow)\d", key))}
    framework = VARIANTS[variant]["args"].get("FRAMEWORK")
    return framework is None or built == {name: name == framework for name in built}


def horovod_cache_image(docker: list[str], variant: str) -> str | None:
    """Put scripts/build_horovod.sh's wheel cache into a small image the Dockerfiles mount (HOROVOD_CACHE).

    Only the wheels that can serve ``variant`` go in: the mounted image is part of the dependency step's build cache,
    so a wheel built for the other image must not invalidate it."""
    cache = Path(os.environ.get("HVDSYNC_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                 / "hvdsync") / "horovod"
    wheels = [w for w in sorted(cache.glob("*/horovod-*.whl")) if _fits(w, variant)]
    if not wheels:
        return None
    tag = f"hvdsync-horovod-cache:{variant}"
    with tempfile.TemporaryDirectory() as ctx:
        for wheel in wheels:
            dest = Path(ctx) / "horovod" / wheel.parent.name
            dest.mkdir(parents=True)
            shutil.copy2(wheel, dest)
            if (wheel.parent / "KEY").exists():
                shutil.copy2(wheel.parent / "KEY", dest)
        (Path(ctx) / "Dockerfile").write_text("FROM scratch\nCOPY horovod/ /horovod/\n")
        subprocess.run(docker + ["build", "-q", "-t", tag, ctx], check=True, capture_output=True)
    say(f"Horovod wheel cache passed in: {len(wheels)} wheel(s) from {cache}")
    return tag


def plan(variant: str, tags: list[str], base: str | None) -> list[str]:
    """What a build of ``variant`` runs, as lines, found without Docker (``--plan``): its Dockerfile, tags, build
    arguments, bases (the public defaults; a local Debian base where they cannot be pulled), and the Horovod
    configuration its build step asks of scripts/build_horovod.sh. Or the line the build stops with (gpu-tf on the
    local base)."""
    v = VARIANTS[variant]
    bases = {arg: base for arg in v["bases"]} if base else v["bases"]
    refuse_local_base(variant, bases.get("BUILD_IMAGE", ""))
    lines = [f"VARIANT={variant}", f"DOCKERFILE=docker/{v['dockerfile']}", f"TAGS={' '.join(tags)}"]
    lines += [f"BUILD_ARG {k}={val}" for k, val in {**v["args"], **bases}.items()]
    framework = v["args"].get("FRAMEWORK")
    if framework:
        lines += [f"HOROVOD_BUILD HVDSYNC_HOROVOD_FRAMEWORKS={framework} HVDSYNC_HOROVOD_GPU=nccl",
                  "CHECK_BUILD NCCL " + ("PyTorch" if framework == "torch" else "TensorFlow") + " Gloo"]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build hvdsync's Docker images (see docker/README.md).")
    p.add_argument("variant", choices=[*VARIANTS, *ALIASES])
    p.add_argument("--tag", help="image tag (default: the variant's, e.g. hvdsync:gpu-tf)")
    p.add_argument("--base", help="base image (default: the public one if it can be pulled, else a local Debian base)")
    p.add_argument("--no-horovod-cache", action="store_true", help="do not pass the local Horovod wheel cache in")
    p.add_argument("--plan", action="store_true", help="print what the build would run and stop (no Docker needed)")
    p.add_argument("docker_args", nargs="*", help="more `docker build` arguments (after --)")
    ns = p.parse_args(argv)
    variant = ALIASES.get(ns.variant, ns.variant)
    tags = [ns.tag] if ns.tag else VARIANTS[variant]["tags"]
    if ns.plan:
        print("\n".join(plan(variant, tags, ns.base)))
        return 0
    if ns.base:
        refuse_local_base(variant, ns.base)      # before any docker command
    try:
        docker = docker_cmd()
        tag = tags[0]
        options = [o for arg, image in resolve_bases(docker, ns.base, variant).items()
                   for o in ("--build-arg", f"{arg}={image}")]
        options += [o for arg, value in VARIANTS[variant]["args"].items() for o in ("--build-arg", f"{arg}={value}")]
        options += [o for extra in tags[1:] for o in ("-t", extra)]
        cache = None if ns.no_horovod_cache else horovod_cache_image(docker, variant)
        if cache:
            options += ["--build-arg", f"HOROVOD_CACHE={cache}"]
        with LocalServer() as server:
            options += pip_build_options(server)
            cmd = docker + ["build", "--network", "host", "-f", f"docker/{VARIANTS[variant]['dockerfile']}", "-t", tag,
                            *options, *ns.docker_args, "."]
            say("$ " + " ".join(shlex.quote(c) for c in cmd))
            start = time.monotonic()
            subprocess.run(cmd, cwd=ROOT, check=True)
            seconds = time.monotonic() - start
    except subprocess.CalledProcessError as err:
        raise BuildError(f"{shlex.join(map(str, err.cmd[:3]))} ... failed (exit {err.returncode}); output above") from None
    size = int(subprocess.run(docker + ["image", "inspect", "-f", "{{.Size}}", tag], capture_output=True, text=True,
                              check=True).stdout)
    say(f"built {' and '.join(tags)} in {seconds:.0f}s; image size {size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
