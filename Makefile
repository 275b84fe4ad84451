# The two commands of the README. Both set up a virtual environment in .venv first.
#   make demo   - the whole pipeline on the embedded default (tiny model, no GPU, no download)
#   make test   - the test suite (unit, pipeline end to end, DVC, real SLURM on localhost when root)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned to the version CI tests (workflow/envs/constraints-cpu.txt); the package itself
# needs torch>=2.1. On Linux PyPI's torch==2.13.0 is the CUDA build (15 nvidia wheels, ~3 GB): on
# a machine without an NVIDIA GPU (no nvidia-smi) setup takes the +cpu build, from PyTorch's CPU
# index or a local wheelhouse (CI's /opt/wheels, pip's find-links; an index that does not answer
# only costs pip's retries); with nvidia-smi, PyPI's build. Both overridable:
#   make setup TORCH=torch==2.13.0 TORCH_INDEX=
# The install is docs/cluster.md's recipe with the CPU torch standing in for the site's build:
# torch first, then everything under the project's constraints.
TORCH_VERSION := $(shell sed -n 's/^torch==//p' workflow/envs/constraints-cpu.txt)
ifeq ($(shell command -v nvidia-smi 2>/dev/null),)
TORCH ?= torch==$(TORCH_VERSION)+cpu
TORCH_INDEX ?= --extra-index-url https://download.pytorch.org/whl/cpu
else
TORCH ?= torch==$(TORCH_VERSION)
TORCH_INDEX ?=
endif
EXTRAS ?= dev,workflow,ocr,zoo
CONSTRAINTS ?= -c workflow/envs/constraints.txt

.PHONY: setup demo lock lint stats test test-clip test-paper test-geneval-mmdet gpu-check mutants container test-container clean

$(BIN)/marble: pyproject.toml workflow/envs/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/pip install $(CONSTRAINTS) -e ".[$(EXTRAS)]" "$(TORCH)"
	touch $@

setup: $(BIN)/marble

# Rules call `marble` and `python`: the venv's bin goes first on PATH. Its jobs run here, so the
# preflight doctor skips SLURM (MARBLE_LOCAL_JOBS; a SLURM client on the machine is not a
# cluster to check). It ends with where the report is and its verdict in one line.
demo: setup
	MARBLE_LOCAL_JOBS=1 PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake -c2 all
	$(BIN)/marble report summary results/report

# dvc.lock after a change to code, rules or params: `dvc repro` runs the demo's stages (the claim is
# not a stage: it runs only when named) and records every dependency's hash; commit dvc.lock with the
# change (tests/test_dvc_lock.py fails on a stale lock, as a package manager's lock check does).
lock: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

# ruff's rules and line length: pyproject.toml [tool.ruff]; seconds, so it runs before the tests.
# The project's size (product / experiments / test beds / tests lines and files, docs words,
# dependencies): growth is a decision (docs/ARCHITECTURE.md, "Product, experiments, test beds").
stats:
	$(PYTHON) tests/size.py

lint: setup
	$(BIN)/ruff check .

# Two pytest-xdist workers (TEST_WORKERS=0: one process, as before). Most of the suite's minutes
# are single-threaded subprocesses (imports, Snakemake, DVC) and waits on SLURM's timers, so a
# second worker on 2 cores shortens it; tests/conftest.py hands the workers whole modules (one
# unit for every module of the localhost SLURM) and starts the slow ones first.
TEST_WORKERS ?= 2
test: setup lint
	PATH="$(abspath $(BIN)):$$PATH" MARBLE_TEST_EXTRAS="$(EXTRAS)" $(BIN)/python -m pytest -q --timeout=1800 --durations=15 \
	  $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS)) tests

# Curated mutations of the core (marble/tools/mutants_catalogue.py), each applied in a scratch
# copy of the tree and run against the tests that must catch it; prints caught / missed with
# times and fails unless every mutant is caught. One: `$(BIN)/python -m marble.tools.mutants --only NAME`.
mutants: setup
	$(BIN)/python -m marble.tools.mutants

# One bare GPU machine, <= 8 minutes (docs/gpu_check.md): no venv, no registry. The machine's
# own python3 (torch, peft, transformers, ...) plus the wheels carried in .whl/ (pip download
# them beforehand; installed here with --no-index into .whl/site). One JSON. CPU plumbing: --tiny.
WHEELS ?= .whl
gpu-check:
	if ls $(WHEELS)/*.whl >/dev/null 2>&1; then \
		$(PYTHON) -m pip install --no-index --no-deps --quiet --target $(WHEELS)/site $(WHEELS)/*.whl; fi
	mkdir -p results
	PYTHONPATH="$(abspath $(WHEELS)/site):$(CURDIR):$(CURDIR)/tests" $(PYTHON) -m marble.tools.gpu_check --out results/gpu_check.json

# The open_clip-based scorers (HPSv2.1) need torchvision, which must match torch exactly:
# a second environment with the torch 2.14.1 / torchvision 0.29.1 pair runs their tests and
# test-paper (about 100 s to install when the wheels are cached, ~5.6 GB).
CLIP_VENV ?= .venv-clip
CLIP_TORCH ?= torch==2.14.1 torchvision==0.29.1

$(CLIP_VENV)/bin/marble: pyproject.toml
	$(PYTHON) -m venv $(CLIP_VENV)
	$(CLIP_VENV)/bin/pip install $(CLIP_TORCH)
	$(CLIP_VENV)/bin/pip install $(CONSTRAINTS) -e ".[dev,clip,workflow,ocr]" $(CLIP_TORCH)
	touch $@

test-clip: $(CLIP_VENV)/bin/marble
	$(CLIP_VENV)/bin/python -m pytest -q tests/test_rewards_hpsv2.py

# The paper configuration with only sizes shrunk, from nothing, against a local loopback mirror of
# every paper asset (tiny random replicas in the real formats; no network). On failure it names the
# stage and its log. Every paper reward runs through its real class, HPSv2.1 on open_clip too, so it
# runs in the clip environment above (with the workflow and OCR extras). See docs/downloads.md.
# It trains into this checkout's results/runs: where `make demo`'s tiny runs sit under the same
# names it stops first, naming them (run it in a fresh clone, or move results/ aside).
test-paper: $(CLIP_VENV)/bin/marble
	PATH="$(abspath $(CLIP_VENV)/bin):$$PATH" PYTHONPATH="$(CURDIR)/tests" $(CLIP_VENV)/bin/python -m beds.paper_mini

# GenEval's real detector path, not in CI: mmdet 2.28.2 + mmcv-full 1.7.2 in a third environment.
# mmcv.runner imports torchvision, so this uses the clip pair (torch 2.14.1 / torchvision 0.29.1;
# PyPI's torchvision for the CPU torch 2.13 does not import). mmcv-full has no wheel for it: its
# CPU ops compile from source (`setuptools<81`, no build isolation; 26 min on 2 busy cores). The
# wheel is kept under .cache/wheels/<torch>/ (`make clean` keeps it), so a rebuilt environment
# takes 3 min. The test builds a tiny random Mask2Former in the reference's config and checkpoint
# formats (tests/beds/mmdet_replica.py) and scores images through GenEvalReward and `marble evaluate`.
MMDET_VENV ?= .venv-mmdet
MMCV ?= mmcv-full==1.7.2
MMDET ?= mmdet==2.28.2
MMDET_TORCH ?= $(CLIP_TORCH)
MMCV_WHEELS ?= .cache/wheels/$(subst ==,-,$(firstword $(MMDET_TORCH)))

MMCV_SRC := .cache/src/$(subst ==,-,$(MMCV))

# The source build: torch 2.14's headers need C++20 and mmcv-full 1.7.2's setup.py asks for C++17
# (the last -std flag wins), so its sdist is unpacked and that one flag raised. --no-cache-dir:
# pip's wheel cache could hand back an mmcv built against another torch.
$(MMCV_WHEELS)/.built:
	$(PYTHON) -m venv $(MMDET_VENV)
	$(MMDET_VENV)/bin/pip install --upgrade pip
	$(MMDET_VENV)/bin/pip install $(MMDET_TORCH) "setuptools<81" wheel ninja numpy
	mkdir -p .cache/src $(MMCV_WHEELS)
	$(MMDET_VENV)/bin/pip download --no-binary :all: --no-deps --no-build-isolation "$(MMCV)" -d .cache/src
	rm -rf $(MMCV_SRC) && tar xzf $(MMCV_SRC).tar.gz -C .cache/src
	sed -i "s/\['cxx'\] = \['-std=c++17'\]/['cxx'] = ['-std=c++20']/" $(MMCV_SRC)/setup.py
	grep -q "std=c++20" $(MMCV_SRC)/setup.py
	MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=2 $(MMDET_VENV)/bin/pip wheel --no-cache-dir --no-build-isolation \
		--no-deps $(MMCV_SRC) -w $(MMCV_WHEELS)
	touch $@

$(MMDET_VENV)/bin/marble: pyproject.toml $(MMCV_WHEELS)/.built
	$(PYTHON) -m venv $(MMDET_VENV)
	$(MMDET_VENV)/bin/pip install --upgrade pip
	$(MMDET_VENV)/bin/pip install $(MMDET_TORCH) "setuptools<81" wheel numpy
	$(MMDET_VENV)/bin/pip install --no-deps --no-index --find-links $(MMCV_WHEELS) "$(MMCV)"
	$(MMDET_VENV)/bin/pip install -e ".[dev,geneval]" "$(MMDET)" $(MMDET_TORCH)
	touch $@

test-geneval-mmdet: $(MMDET_VENV)/bin/marble
	PATH="$(abspath $(MMDET_VENV)/bin):$$PATH" $(MMDET_VENV)/bin/python -m pytest -q -rs tests/test_geneval_mmdet.py

# The paper stack for CUDA GPUs as an OCI image (container/Containerfile; docs/container.md),
# built here from Debian packages (debootstrap: container/base.sh) and PyPI only, not in CI.
# test-container builds it and runs the tiny demo inside it with no network (root, podman;
# measured: docs/container.md). This sandbox needs `--isolation chroot` for builds and runc
# with explicit --ulimit for runs (hybrid cgroups, low hard limits): container/test.sh's
# defaults; PODMAN_BUILD_FLAGS= PODMAN_RUN_FLAGS= where podman works out of the box.
CONTAINER_IMAGE ?= localhost/marble:dev
container:
	IMAGE=$(CONTAINER_IMAGE) STAGES=build container/test.sh

# Its last stage runs this checkout's Snakemake (the venv) with --sdm apptainer, as a site does.
test-container: setup
	IMAGE=$(CONTAINER_IMAGE) SNAKEMAKE=$(abspath $(BIN))/snakemake container/test.sh

clean:
	rm -rf $(VENV) $(CLIP_VENV) $(MMDET_VENV) .snakemake results/runs results/eval results/report results/bench logs benchmarks data/mirror
