# The two first commands of the README:
#   make demo   set everything up, then train on 2 local Horovod workers (PyTorch, then TensorFlow)
#   make test   set everything up, then run the whole test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test lab bench clean-horovod-cache docker-cpu docker-gpu docker-gpu-torch docker-gpu-tf docker-test docs docs-check

install:
	HVDSYNC_VENV=$(VENV) bash scripts/install.sh

demo: install
	$(VENV)/bin/hvdsync train --framework torch --np 2
	$(VENV)/bin/hvdsync train --framework tensorflow --np 2 --compression fp16 --accumulate 4
	@echo "Both runs are recorded in ./mlflow.db: $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db"

# The multi-host and Slurm tests (tests/hosts, tests/slurm) need sshd, iproute2, OpenMPI, Slurm and munge from the
# system: installed here where this runs as root, BEFORE the environment, so that its one Horovod build has MPI.
# The one-process tests (tests/unit, tests/repo) run on 2 pytest-xdist workers (~1 min less on 2 cores); the rest,
# which start Horovod workers, test hosts and clusters of their own, one at a time as before.
test:
	bash scripts/install_test_hosts.sh
	$(MAKE) --no-print-directory install
	$(PY) -m pytest -n 2 tests/unit tests/repo
	$(PY) -m pytest --ignore=tests/unit --ignore=tests/repo

lab: install
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

# Each run is kept as benchmarks/results/<suite>/<date>[-<part>]-make-bench.{txt,json,md} and listed in the index,
# benchmarks/results/README.md, which each runner regenerates (benchmarks/README.md: the suites, what they measure).
bench: install
	$(PY) benchmarks/allreduce.py --record make-bench
	$(PY) benchmarks/compression.py --record make-bench
	$(PY) benchmarks/training.py --record make-bench
	$(PY) benchmarks/knobs.py --record make-bench idle-loop
	$(PY) benchmarks/shares.py --record make-bench
	$(PY) benchmarks/index.py --check

# The documentation site in site/ (README, "Documentation site"): the guides, the API reference, the benchmark results
# and every notebook rendered with its outputs. Executed copies the notebook tests left in build/notebooks are reused;
# the others are executed (DOCS_ARGS="--missing render --stale render" executes none). docs-check opens every page in
# a headless chromium: opt-in, not part of `make test`.
docs: install
	HVDSYNC_VENV=$(VENV) bash scripts/install_docs_deps.sh
	$(PY) -m scripts.docs.build $(DOCS_ARGS)

docs-check: docs
	HVDSYNC_VENV=$(VENV) bash scripts/install_docs_deps.sh --browser
	$(PY) -m scripts.docs.check

# tracking-check: two runs and a sweep in a fresh store, MLflow's UI through `hvdsync runs ui`, opened in headless
# chromium (scripts/tracking_check.py); screenshots in docs/measurements/tracking. Opt-in, not part of `make test`.
.PHONY: tracking-check
tracking-check: install
	HVDSYNC_VENV=$(VENV) bash scripts/install_docs_deps.sh --browser
	$(PY) -m scripts.tracking_check

clean-horovod-cache:
	rm -rf "$${HVDSYNC_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/hvdsync}/horovod"

# Docker images (docker/README.md). They need a Docker engine; `make test` does not.
docker-cpu:
	python3 docker/build.py cpu

docker-gpu:
	python3 docker/build.py gpu

# One GPU image per framework, each with its own CUDA (docker/README.md, "Two GPU images"); docker-gpu is gpu-torch.
docker-gpu-torch:
	python3 docker/build.py gpu-torch

docker-gpu-tf:
	python3 docker/build.py gpu-tf

# Opt-in tests: build both images, run the demo and the smoke test in the CPU one, check-build in the GPU one.
docker-test: install
	$(PY) -m pytest -m docker tests/docker -v
