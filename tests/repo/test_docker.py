"""The Docker images' files, checked without a Docker engine: lint, what enters a build and how, the errors.

Building and running the images is opt-in (tests/docker/, `make docker-test`).
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCKERFILES = [ROOT / "docker" / "Dockerfile.cpu", ROOT / "docker" / "Dockerfile.gpu"]
# docker/build.py is a script, not a package module: load it by path (the name `build` is a PyPI package's).
_spec = importlib.util.spec_from_file_location("hvdsync_docker_build", ROOT / "docker" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def _stages(dockerfile: Path) -> list[str]:
    """The Dockerfile's stages as text, continued lines joined, comments dropped."""
    lines = [line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")]
    return re.split(r"^(?=FROM )", "\n".join(lines).replace("\\\n", " "), flags=re.M)[1:]


def test_dockerfiles_pass_hadolint():
    out = subprocess.run([str(BIN / "hadolint"), "--config", "docker/hadolint.yaml", *map(str, DOCKERFILES)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # Every rule left out is there with its reason (a comment right above it).
    config = (ROOT / "docker" / "hadolint.yaml").read_text()
    for rule in re.findall(r"^\s*- (DL\d+|SC\d+)", config, re.M):
        assert re.search(rf"#[^\n]*{rule}[^\n]*\n(\s*#.*\n)*\s*- {rule}", config), rule


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_base_is_a_build_argument_defaulting_to_a_public_image(dockerfile):
    text = dockerfile.read_text()
    head = text.split("\nFROM ", 1)[0]
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", head, re.M).group(1)
    assert "/" in base or base.startswith("python:"), base          # a registry image, not a local one
    assert not base.endswith(":latest") and ":" in base
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)          # the final stage stands on it


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_pip_settings_enter_the_builder_only_and_the_cert_as_a_secret(dockerfile):
    *builders, final = _stages(dockerfile)
    builder = next(s for s in builders if " AS builder" in s.split("\n", 1)[0])
    # pip's URLs are build arguments of the builder stage; no stage bakes them (or a cert) into ENV.
    assert re.search(r"^ARG PIP_INDEX_URL$", builder, re.M) and re.search(r"^ARG PIP_EXTRA_INDEX_URL", builder, re.M)
    for stage in builders + [final]:
        env = " ".join(re.findall(r"^ENV (.*)$", stage, re.M))
        assert "PIP_CERT" not in env and "INDEX_URL" not in env and "FIND_LINKS" not in env, env
    assert "ARG PIP_" not in final
    # Every RUN that installs with pip (directly or through install.sh) mounts the cert secret and points PIP_CERT at
    # it; the final stage's `pip install --no-deps` of hvdsync itself reaches no index and gets no pip settings.
    pip_runs = [r for r in re.findall(r"^RUN (.*)$", builder, re.M) if "pip install" in r or "install.sh" in r]
    assert pip_runs
    for run in pip_runs:
        assert "--mount=type=secret,id=pip_cert" in run and "PIP_CERT=/run/secrets/pip_cert" in run, run


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_has_no_compiler_and_no_source_tree(dockerfile):
    final = _stages(dockerfile)[-1]
    assert not re.search(r"build-essential|g\+\+|gcc|python3-dev|\bmake\b", final), final
    copies = re.findall(r"^COPY (.*)$", final, re.M)
    assert any("--from=builder /opt/venv /opt/venv" in c for c in copies)
    assert not any(re.search(r"(^| )\. ", c) or "scripts" in c for c in copies), copies   # no `COPY . .`
    assert re.search(r"^USER \d+$", final, re.M)                       # not root


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_install_step_gets_every_file_install_sh_reads(dockerfile):
    # The dependency layer copies only what scripts/install.sh needs (so code edits do not invalidate it): each
    # top-level file the script names must be copied before the step that runs it.
    install = (ROOT / "scripts" / "install.sh").read_text()
    needed = {f for f in ("pyproject.toml", "constraints.txt", "README.md") if f in install and (ROOT / f).exists()}
    builder = next(s for s in _stages(dockerfile) if " AS builder" in s.split("\n", 1)[0])
    before = builder.split("install.sh", 1)[0]
    copied = " ".join(re.findall(r"^COPY (.*)$", before, re.M)).split()
    assert needed <= set(copied) | {"README.md"}, (needed, copied)   # README.md: a placeholder is made


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_horovod_cache_is_mounted_not_copied(dockerfile):
    text = dockerfile.read_text()
    assert re.search(r"^ARG HOROVOD_CACHE=scratch$", text, re.M)
    assert re.search(r"^FROM \$\{HOROVOD_CACHE\} AS horovod-cache$", text, re.M)
    # Mounted where scripts/build_horovod.sh looks by default (~/.cache/hvdsync of the build's root user), writable
    # for the build step only: the wheels never land in a layer.
    target = re.search(r"--mount=type=bind,from=horovod-cache,target=(\S+),rw", text).group(1)
    assert target.endswith("/.cache/hvdsync") and target.split("/")[1] == "root"


def test_build_options_carry_this_machines_pip_settings_as_args_and_secrets(tmp_path, monkeypatch):
    # A pip configuration like a machine with a local wheel folder, a file:// index, a CA bundle and constraints.
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "demo-1.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    index = tmp_path / "mirror" / "simple"
    (index / "demo").mkdir(parents=True)
    (index / "demo" / "index.html").write_text('<a href="../../files/demo-1.0.tar.gz">demo</a>')
    cert, constraint = tmp_path / "ca.pem", tmp_path / "constraints.txt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    constraint.write_text("torch<=2.14.1\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheels}\nextra-index-url = https://example.org/simple file://{index}\n"
                    f"constraint = {constraint}\ndefault-timeout = 99\n")
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_CERT", str(cert))                   # a PIP_* variable, as on this machine
    with build.LocalServer() as server:
        options = build.pip_build_options(server)
        args = dict(o.split("=", 1) for o in options[1::2] if not o.startswith("id="))
        secrets = [o for o in options[1::2] if o.startswith("id=")]
        # Local folders are served on 127.0.0.1; remote URLs pass unchanged; files become secrets.
        find_links = args["PIP_FIND_LINKS"]
        assert find_links.startswith(server.url) and str(tmp_path) not in find_links
        listing = urllib.request.urlopen(find_links, timeout=10).read().decode()
        assert "demo-1.0-py3-none-any.whl" in listing
        remote, local = args["PIP_EXTRA_INDEX_URL"].split()
        assert remote == "https://example.org/simple" and local.startswith(server.url)
        page = urllib.request.urlopen(local + "demo/", timeout=10).read().decode()
        assert "../../files/demo-1.0.tar.gz" in page                # and its relative links still resolve
        assert args["PIP_DEFAULT_TIMEOUT"] == "99"
        assert sorted(secrets) == [f"id=pip_cert,src={cert}", f"id=pip_constraint,src={constraint}"]
        # The same settings give the same build arguments the next time (they are part of the layer cache's key).
        port = server.httpd.server_address[1]
    with build.LocalServer(port) as again:
        assert build.pip_build_options(again) == options
        assert not any("cert" in o or "constraint" in o for o in options[1::2] if not o.startswith("id="))


def _run_build(env_extra):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "docker/build.py", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


def test_without_docker_the_build_says_how_to_get_it_in_one_line():
    out = _run_build({"DOCKER": "no-such-docker-client"})
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.count("\n") == 1, out.stderr
    assert "no docker client" in out.stderr and "apt-get install docker.io" in out.stderr
    # A client whose engine does not answer (`false info` fails, as `docker info` does with no dockerd).
    out = _run_build({"DOCKER": "false"})
    assert out.stderr.count("\n") == 1 and "no Docker engine answers" in out.stderr and "dockerd" in out.stderr


def _gpu_build(tmp_path, **env):
    full = {**os.environ, "PYTHON": sys.executable, "HVDSYNC_HOROVOD_GPU": "nccl", "HVDSYNC_CACHE": str(tmp_path),
            **env}
    return subprocess.run(["bash", "scripts/build_horovod.sh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=full)


def test_nccl_build_names_the_missing_piece(tmp_path):
    # This environment's torch is the CPU build: nothing is built, and the message says so.
    out = _gpu_build(tmp_path)
    assert out.returncode == 2, out.stderr
    assert "missing: the CUDA build of torch" in out.stderr and "+cpu" in out.stderr
    # A CUDA torch (its version file says so) with neither nvcc nor pip's CUDA compiler wheel: nvcc is named.
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "version.py").write_text("cuda: Optional[str] = '13.0'\n")
    out = _gpu_build(tmp_path, PYTHONPATH=str(tmp_path / "site"), HVDSYNC_CUDA_FROM_WHEELS="1")
    assert out.returncode == 2
    assert "missing: a CUDA compiler" in out.stderr and "cuda-build-requirements.txt" in out.stderr, out.stderr
    assert not list(tmp_path.glob("horovod/*"))                 # nothing was built or cached
    # A mode that does not exist.
    out = _gpu_build(tmp_path, HVDSYNC_HOROVOD_GPU="rocm")
    assert out.returncode == 2 and "HVDSYNC_HOROVOD_GPU: 'rocm' is not allowed; choose one of: auto, cpu, nccl" \
        in out.stderr


def test_cpu_build_stays_cpu_next_to_a_cuda_compiler():
    # A CUDA compiler on PATH does not turn a CPU-torch environment into an NCCL build: auto mode also wants torch's
    # CUDA build (a Horovod built for CUDA next to CPU torch is of no use).
    if not shutil.which("nvcc"):
        pytest.skip("no nvcc on PATH: nothing to be tempted by")
    env = {**os.environ, "PYTHON": sys.executable}
    key = subprocess.run(["bash", "scripts/build_horovod.sh", "--print-key"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=env, check=True).stdout.split("\n")[0]
    assert "-cpu-" in key and "nccl" not in key


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_venv_layer_does_not_depend_on_hvdsyncs_code(dockerfile):
    # The builder (dependencies, Horovod) sees pyproject.toml, constraints.txt and scripts/ only; the final stage
    # copies the venv before anything that reads the build context, and installs hvdsync itself without
    # dependencies last. So a code change re-runs only that last step, never the GB-sized venv layer.
    stages = _stages(dockerfile)
    builder = next(s for s in stages if " AS builder" in s.split("\n", 1)[0])
    sources = [src for c in re.findall(r"^COPY (.*)$", builder, re.M) for src in c.split()[:-1]]
    assert {"pyproject.toml", "constraints.txt"} <= set(sources), sources
    assert all(src in ("pyproject.toml", "constraints.txt") or src.startswith("scripts/") for src in sources), sources
    steps = re.findall(r"^(COPY|RUN) (.*)$", stages[-1], re.M)
    reads_context = [i for i, (op, args) in enumerate(steps)
                     if (op == "COPY" and "--from=" not in args) or "--mount=type=bind,target=" in args]
    venv = next(i for i, (op, args) in enumerate(steps) if "--from=builder /opt/venv" in args)
    assert reads_context and venv < min(reads_context), steps
    install = steps[-1][1]
    assert re.search(r"--mount=type=bind,target=(\S+),rw .*pip install .*--no-deps .*\1$", install), install


def test_the_gpu_tf_image_installs_the_full_tensorflow_wheel_with_its_cuda_12():
    # tensorflow-cpu lacks the GPU kernels an NCCL build of Horovod links to: the TensorFlow GPU image takes the
    # `tensorflow-gpu` extra and TensorFlow's own CUDA 12 wheels; the torch GPU image holds no TensorFlow at all.
    import tomllib
    text = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    torch_case = re.search(r"^ +torch\) extras=(\S+) cuda_reqs=(\S+) ;;", text, re.M)
    tf_case = re.search(r"^ +tensorflow\) extras=(\S+) \\\n +&& \{ command -v nvcc >/dev/null \|\| ", text, re.M)
    assert torch_case and tf_case, text
    assert torch_case.groups() == ("torch,notebooks,dev,build", "scripts/cuda-build-requirements.txt")
    # No compiler wheels for CUDA 12 (PyPI has no nvcc 12): the builder must bring nvcc (test_docker_gpu_variants.py).
    assert tf_case.groups() == ("tensorflow-gpu,notebooks,dev,build",)
    assert 'HVDSYNC_EXTRAS="$extras" HVDSYNC_INSTALL_HOROVOD=0 bash scripts/install.sh' in text
    assert re.search(r'if \[ "\$FRAMEWORK" = tensorflow \]; then \\\n +/opt/venv/bin/pip install --quiet -c '
                     r'constraints.txt "tensorflow\[and-cuda\]"', text), text
    assert 'HVDSYNC_HOROVOD_FRAMEWORKS="$FRAMEWORK" HVDSYNC_HOROVOD_GPU=nccl' in text
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["tensorflow-gpu"][0].startswith("tensorflow>")
    assert not any("tensorflow" in e for e in extras["torch"] + extras["notebooks"] + extras["dev"] + extras["build"])


def test_each_image_gets_only_the_horovod_wheels_it_can_use(tmp_path):
    # The cache image is part of the dependency step's build cache: a wheel for another image must not enter it.
    for name, key in [("a", "horovod0.28.1-cp311-...-tf2.21.0-cpu-gcc12.2.0-fixes1"),
                      ("b", "horovod0.28.1-cp311-...-tensorflow2.21.0-cuda12.9-nccl2.27.7-cc80,90-gcc12.2.0-fixes2"),
                      ("c", None),
                      ("d", "horovod0.28.1-cp311-...-torch2.13.0-cuda13.0-nccl2.29.7-cc80,90-gcc12.2.0-fixes3"),
                      ("e", "horovod0.28.1-cp311-...-torch2.13.0-tensorflow2.21.0-cuda13.0-nccl2.29.7-cc80,90-gcc12.2.0"
                            "-fixes4")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
        if key:
            (tmp_path / name / "KEY").write_text(key + "\n")
    wheels = sorted(tmp_path.glob("*/*.whl"))
    assert [w.parent.name for w in wheels if build._fits(w, "cpu")] == ["a", "c"]
    # One framework per GPU image: the old two-framework NCCL wheel (e) serves neither.
    assert [w.parent.name for w in wheels if build._fits(w, "gpu-tf")] == ["b", "c"]
    assert [w.parent.name for w in wheels if build._fits(w, "gpu-torch")] == ["c", "d"]
    assert [w.parent.name for w in wheels if build._fits(w, "gpu")] == ["c", "d"]


def _fake_cuda(tmp_path, nccl=True):
    """A CUDA toolkit and NCCL as build_horovod.sh sees them (nvcc's version and root, the headers) plus a torch that
    says it is a CUDA 13.0 build: enough for the script to decide and print its key, nothing is compiled."""
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True, exist_ok=True)
    (cuda / "include").mkdir(exist_ok=True)
    (cuda / "include" / "cuda_runtime.h").write_text("")
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text('#!/bin/sh\ncase "$*" in *--version*) echo "Cuda compilation tools, release 13.0, V13.0.88";;\n'
                    f'  *) echo "#$ TOP={cuda}" >&2;; esac\n')
    nvcc.chmod(0o755)
    torch = tmp_path / "site" / "torch"
    torch.mkdir(parents=True, exist_ok=True)
    (torch / "__init__.py").write_text("")
    (torch / "version.py").write_text("cuda: Optional[str] = '13.0'\n")
    env = {"PATH": f"{cuda / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "site")}
    if nccl:
        (tmp_path / "nccl" / "include").mkdir(parents=True, exist_ok=True)
        (tmp_path / "nccl" / "include" / "nccl.h").write_text(
            "#define NCCL_MAJOR 2\n#define NCCL_MINOR 29\n#define NCCL_PATCH 7\n")
        env["HOROVOD_NCCL_HOME"] = str(tmp_path / "nccl")
    return env


def test_nccl_build_with_neither_system_cuda_nor_the_wheels_names_the_compiler(tmp_path):
    # The machine as a bare GPU-less box: a CUDA torch, but no nvcc on PATH, nothing under $CUDA_HOME, and no
    # nvidia-cuda-nvcc wheel in the environment (this environment's nvidia/ holds none): nvcc and the way to get it
    # from pip are named, nothing is built.
    env = _fake_cuda(tmp_path)
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "sed", "paste", "sha256sum", "cut", "cat", "ls", "head", "id", "dirname"):
        found = shutil.which(tool, path="/usr/bin:/bin")
        assert found, tool
        (bare / tool).symlink_to(found)
    env["PATH"] = str(bare)
    out = _gpu_build(tmp_path, CUDA_HOME=str(tmp_path / "no-cuda"), **env)
    assert out.returncode == 2, out.stderr
    assert "missing: a CUDA compiler: no nvcc on PATH or in $CUDA_HOME, and no nvidia-cuda-nvcc wheel for CUDA 13.0" \
        in out.stderr and "pip install -r scripts/cuda-build-requirements.txt" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and not list(tmp_path.glob("horovod/*"))
    # nvcc found, but no runtime headers beside it: the headers are named.
    env = _fake_cuda(tmp_path)
    (tmp_path / "cuda" / "include" / "cuda_runtime.h").unlink()
    out = _gpu_build(tmp_path, **env)
    assert out.returncode == 2 and "missing: CUDA's runtime headers" in out.stderr, out.stderr


def test_nccl_build_without_nccl_names_it(tmp_path):
    out = _gpu_build(tmp_path, **_fake_cuda(tmp_path, nccl=False))
    assert out.returncode == 2 and "missing: NCCL" in out.stderr and "nvidia-nccl-cu13" in out.stderr, out.stderr


def test_gpu_only_patches_enter_the_key_of_nccl_builds_only(tmp_path):
    # A copy of scripts/ to add patches to; the keys are printed, nothing is built.
    scripts = tmp_path / "scripts"
    shutil.copytree(ROOT / "scripts", scripts)

    def keys():
        env = {**os.environ, "PYTHON": sys.executable, "HVDSYNC_CACHE": str(tmp_path)}
        cpu = subprocess.run(["bash", str(scripts / "build_horovod.sh"), "--print-key"], capture_output=True,
                             text=True, timeout=60, env={**env, "HVDSYNC_HOROVOD_GPU": "cpu"}, check=True)
        nccl = subprocess.run(["bash", str(scripts / "build_horovod.sh"), "--print-key"], capture_output=True,
                              text=True, timeout=60, env={**env, "HVDSYNC_HOROVOD_GPU": "nccl", **_fake_cuda(tmp_path)},
                              check=True)
        return cpu.stdout.split("\n")[0], nccl.stdout.split("\n")[0]

    cpu, nccl = keys()
    assert "-cpu-" in cpu and "-cuda13.0-nccl2.29.7-cc80,90-" in nccl, (cpu, nccl)
    assert "-tf2.21.0-" in cpu                       # tensorflow-cpu: the short name existing caches are keyed by
    (scripts / "horovod-patches" / "gpu" / "0199-probe.patch").write_text("a GPU-only change\n")
    cpu2, nccl2 = keys()
    assert cpu2 == cpu and nccl2 != nccl
    (scripts / "horovod-patches" / "0099-probe.patch").write_text("a change for every build\n")
    cpu3, nccl3 = keys()
    assert cpu3 != cpu and nccl3 != nccl2
