# offload-launch: every command a person runs. `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# On a machine without an NVIDIA GPU take the CPU build of torch (this pip has torch 2.13.0 locally);
# with a GPU let pip pick the CUDA build (or keep the one you installed).
TORCH_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch>=2.4,torch==2.13.0)
# The releases this checkout is tested with (pyproject.toml says so; the bundled profiles in launcher/models/profiles/
# are counted under this transformers): `make install` takes them, so a release made since cannot change what
# `make test` sees. Users' installs take any release pyproject.toml allows.
TESTED_SPEC ?= transformers==5.24.0 deepspeed==0.19.8 peft==0.22.0

.PHONY: install demo test test-fast bench gpu-smoke gpu-check wheelhouse lint format docs bundled-profiles clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@# System packages (root + apt): libaio-dev, numactl, pdsh, openssh-server, Slurm; see the script.
	@bash scripts/system_packages.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev,adapters]" $(TESTED_SPEC)
	touch $(STAMP)

demo: $(STAMP)
	@echo "== 1/3  Llama-2-7B planned for this machine (exit 3 = does not fit here; the table says why)"
	-$(BIN)/offload-launch --model meta-llama/Llama-2-7b --dry-run
	@echo
	@echo "== 2/3  Llama-2-7B planned for a described 24 GB workstation (recipes/hosts/1x-rtx4090-24g.yaml)"
	$(BIN)/offload-launch --model meta-llama/Llama-2-7b --dry-run --host-spec recipes/hosts/1x-rtx4090-24g.yaml
	@echo
	@echo "== 3/3  Training the bundled tiny Llama for real (recipes/tiny-demo.yaml): ZeRO-3 + optimizer and parameters on CPU + DeepSpeedCPUAdam"
	$(BIN)/offload-launch --recipe tiny-demo --no-resume
	$(BIN)/offload-launch report runs/demo

test: $(STAMP)
	$(BIN)/pytest -q

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not e2e and not gpu and not slow"

# Measured side by side in one run; prints a table and writes bench.json (about 11 minutes on 2 cores).
bench: $(STAMP)
	TORCH_EXTENSIONS_DIR=$(CURDIR)/$(VENV)/torch_extensions $(BIN)/python -m launcher.bench --out bench.json

gpu-smoke: $(STAMP)
	$(BIN)/pytest -q -s -m gpu tests/gpu

# `make gpu-check`: on a host with one CUDA GPU (under 8 minutes), the probe at the check model's shapes, then a
# smoke run of a one-layer Llama-2-7B-shaped model under each strategy family; writes $(GPU_CHECK_OUT), predicted vs
# measured GPU memory, CPU memory and step time. With $(WHEELHOUSE) present it installs from it, offline, into
# $(PYTHON) (the interpreter that already has torch and transformers: PYTHON=/path/to/venv/bin/python); otherwise
# it uses .venv (`make install`, network).
WHEELHOUSE    ?= build/wheelhouse
GPU_CHECK_OUT ?= gpu-check.json
PY            ?= 3.12
PLATFORM      ?= manylinux2014_x86_64
gpu-check:
ifneq ($(wildcard $(WHEELHOUSE)/*.whl),)
	$(PYTHON) -m pip install -q --no-index --find-links $(WHEELHOUSE) -e .
	$(PYTHON) scripts/gpu_check.py --out $(GPU_CHECK_OUT)
else
	$(MAKE) install
	$(BIN)/python scripts/gpu_check.py --out $(GPU_CHECK_OUT)
endif

# `make wheelhouse PY=3.12 PLATFORM=manylinux2014_x86_64`: every wheel an air-gapped GPU host needs besides torch and
# transformers (DeepSpeed built here from its sdist, pure Python; this package; their dependencies), into
# $(WHEELHOUSE) (git-ignored under build/). SKIP="numpy pyarrow ..." leaves out more that the host already has.
wheelhouse: $(STAMP)
	PYTHON=$(BIN)/python scripts/wheelhouse.sh $(WHEELHOUSE) $(PY) $(PLATFORM)

# docs/options.md's table is generated from launcher/settings.py (tests/test_settings.py fails when stale).
docs: $(STAMP)
	$(BIN)/python scripts/sync_options_doc.py

# launcher/models/profiles/: the bundled configs counted under this transformers, so a first plan of one skips
# importing transformers (tests/inspection/test_shipped_profiles.py fails when they are stale).
bundled-profiles: $(STAMP)
	$(BIN)/python scripts/count_bundled_models.py

lint: $(STAMP)
	$(BIN)/ruff check launcher tests scripts
	$(BIN)/ruff format --check launcher tests scripts

format: $(STAMP)
	$(BIN)/ruff check --fix launcher tests
	$(BIN)/ruff format launcher tests

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
