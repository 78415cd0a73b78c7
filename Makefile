# Everything installs into .venv from this file; nothing is assumed to be on the machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test lint bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/h5forge demo

test: install
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check h5forge tasks flows deployments tests benchmarks
	$(VENV)/bin/mypy h5forge tasks flows

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
