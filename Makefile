# The user interface of the suite. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
SCALE ?= default
NOTEBOOK ?=
FORCE ?=
PARAMS ?= {}
REFETCH ?=
# Where per-user / per-seed jobs run (lib/ondevice/engine): sequential (default), dask with WORKERS
# local processes, or a Dask cluster by address (CLUSTER=tcp://host:8786).
ENGINE ?=
WORKERS ?= 2
CLUSTER ?=
export ONDEVICE_ENGINE := $(ENGINE)
export ONDEVICE_WORKERS := $(WORKERS)
export ONDEVICE_CLUSTER := $(CLUSTER)
KERNEL := ondevice
# A local copy of the data laid out like the official releases (tests and CI use ../shared/data).
ONDEVICE_DATA_MIRROR ?= $(abspath $(wildcard ../shared/data))
export ONDEVICE_DATA_MIRROR
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: apt-lists help setup reproduce verify test data lab clean clean-results distclean lock publish browser export export-builtin bench new-paper

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'
	@echo "  variables: SCALE=smoke|default|paper  NOTEBOOK=<name>  FORCE=1  PARAMS='{\"seed\": 1}'  REFETCH=1 (data: fetch again)"
	@echo "  ENGINE=sequential|dask  WORKERS=N  CLUSTER=tcp://host:8786 (where fan-out jobs run; lib/ondevice/engine)"
	@echo "  AT_ONCE=N (notebooks run at a time; 2 on 2+ CPUs; timed notebooks always run alone)"

# A Ctrl-C mid-install can leave a package's metadata without its files, which pip then calls
# satisfied: .installed is written only once tools/venv_check.py has found every pin of the lock
# whole (its RECORD's files, pip check, imports, the kernel), reinstalling those that were not.
$(VENV)/.installed: requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	rm -f $@
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip --version >/dev/null 2>&1 || { echo "[setup] $(VENV) has no working pip (an interrupted creation?): creating it again"; $(PYTHON) -m venv --clear $(VENV); }
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.lock
	$(PY) tools/venv_check.py --venv $(VENV) --mend
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "Python (ondevice)" >/dev/null
	$(PY) tools/venv_check.py --venv $(VENV) --fast --kernel $(KERNEL)
	touch $@

# .installed is not trusted blindly: the lock's files are checked each time (under a second).
setup: $(VENV)/.installed ## create .venv from the lock, install lib/ editable, register the Jupyter kernel
	@$(PY) tools/venv_check.py --venv $(VENV) --fast --mend

data: setup apt-lists ## fetch and verify the data sets that SCALE needs (REFETCH=1 fetches again)
	$(PY) -m ondevice.data --scale $(SCALE) $(if $(REFETCH),--refetch)

# Notebooks run AT_ONCE at a time, each with its share of the CPUs; those that measure time run
# afterwards, alone (lib/ondevice/report/at_once.py). AT_ONCE=1 runs them one after another.
AT_ONCE ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -ge 2 ] && echo 2 || echo 1)
RUNNER = $(PY) -m ondevice.report.runner --scale $(SCALE) $(if $(NOTEBOOK),--notebook $(NOTEBOOK)) $(if $(FORCE),--force) --params '$(PARAMS)' --at-once $(AT_ONCE)

reproduce: data ## run every notebook (or NOTEBOOK=name) at SCALE into results/SCALE/; numbers beside the published ones
	$(RUNNER)

verify: data ## as reproduce, but exit 3 when a headline number is outside the published tolerance, 4 when a result is stale
	$(RUNNER) --verify

# Both cores: tests spread over TEST_WORKERS processes; a notebook's tests stay on one worker (tests/conftest.py).
# The smoke data are fetched first, once, so workers never race to fill the data cache.
TEST_WORKERS ?= 2
LINTED = lib tests tools notebooks
test: setup browser apt-lists ## ruff (format and lint), unit tests and a papermill run of every notebook at smoke scale
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)
	$(PY) -m ondevice.data --scale smoke
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=25

# Debian's chromium for the browser test of the site (Playwright drives it; it cannot download
# browsers here). Installed with apt-get when missing and apt is usable (root, or sudo without a
# password); otherwise the browser test is skipped and says why.
CHROMIUM ?= /usr/bin/chromium
export ONDEVICE_CHROMIUM := $(CHROMIUM)
browser: ## install Debian's chromium (apt) for the site's browser test, when it is missing
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then echo "[browser] no apt-get here: the browser test will be skipped"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "[browser] apt-get needs root or password-less sudo: the browser test will be skipped"; exit 0; fi; \
	echo "[browser] installing chromium with apt-get"; \
	$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium >/dev/null

# Fashion-MNIST comes from Debian's dataset-fashion-mnist (apt-get download, no install): apt needs
# its package lists once on a fresh machine (root or password-less sudo); otherwise the official
# release is tried.
apt-lists:
	@if ! command -v apt-get >/dev/null || ls /var/lib/apt/lists/*Packages* >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else exit 0; fi; \
	echo "[data] apt-get update (package lists for apt-get download)"; $$sudo apt-get update -qq

export: data ## every personal model as a trainable .tflite in Flex mode (results/SCALE/export/) and every family in builtin mode beside Flex (export/builtin/), with manifests
	$(PY) -m ondevice.papers.deeptype.export --scale $(SCALE)
	$(PY) -m ondevice.device.parity --out results/$(SCALE)/export/builtin

export-builtin: setup ## every model family as a trainable .tflite in both modes (builtin ops for ai-edge-litert, and Flex), with manifest.json and a step-time/size comparison
	$(PY) -m ondevice.device.parity --out results/$(SCALE)/export/builtin

bench: setup ## print step-time ratios, K users batched vs separate steps, a FedAvg round's clients together vs one at a time, MobileNet FedAvg rounds vs its bare step, TFLite vs TF, reuse latency, achieved vs GEMM FLOP/s, builtin vs Flex step time and size (not a test)
	$(PY) -m ondevice.papers.deeptype.bench
	$(PY) -m ondevice.papers.deeptype.bench_users
	$(PY) -m ondevice.papers.autlearn.bench_fedavg
	$(PY) -m ondevice.papers.autlearn.bench_fedavg --threads 1
	$(PY) -m ondevice.papers.autlearn.bench_fedavg --mobilenet
	$(PY) -m ondevice.device.parity --out build/bench-export

publish: setup ## build the static site site/SCALE/ (and results/SCALE/SUMMARY.md) from stored results, executing nothing
	$(PY) -m ondevice.report.publish --scale $(SCALE) --out site/$(SCALE)

new-paper: ## start a paper from the skeleton: NAME=mypaper copies papers/_template and notebooks/_template (docs/adding-a-paper.md)
	@test -n "$(NAME)" || { echo "usage: make new-paper NAME=mypaper"; exit 2; }
	python3 tools/new_paper.py $(NAME)

lab: setup ## start JupyterLab with the suite's kernel
	$(VENV)/bin/jupyter lab --notebook-dir=. --IdentityProvider.token="$${JUPYTER_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(16))')}" $(if $(filter 0,$(shell id -u)),--allow-root)

lock: ## re-resolve requirements.in into requirements.lock (needs uv)
	uv pip compile requirements.in --python-version 3.11 -o requirements.lock

clean: ## remove build outputs, caches and failed/staging runs (results are kept)
	rm -rf build *.egg-info lib/*.egg-info .pytest_cache results/*/.staging-* results/*/*.failed results/smoke
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +

clean-results: ## remove results/SCALE (asked for explicitly)
	rm -rf results/$(SCALE)

distclean: clean ## also remove the virtual environment
	rm -rf $(VENV)
