# Everything installs into .venv from this file; nothing is assumed to be on the machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test lint bench clean

$(VENV)/.installed: pyproject.toml Makefile
	@echo "==> [1/4] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] upgrading pip"
	$(PY) -m pip install --quiet --upgrade pip
	@echo "==> [3/4] installing $(TORCH_PIN) (the CPU build; the longest step)"
	$(PY) -m pip install --progress-bar on "$(TORCH_PIN)"
	@echo "==> [4/4] installing h5forge and its test extras (Prefect, h5py, moto, ...)"
	$(PY) -m pip install --progress-bar on -e ".[test]"
	@echo "==> installed into $(VENV)"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/h5forge demo

test: install
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) -m pytest

# One format and one lint for the whole tree; CI runs this before the tests.
lint: install
	$(VENV)/bin/ruff format --check h5forge tasks flows deployments tests benchmarks
	$(VENV)/bin/ruff check h5forge tasks flows deployments tests benchmarks
	$(VENV)/bin/mypy h5forge tasks flows deployments

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
