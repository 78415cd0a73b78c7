# Everything installs into .venv from this file; nothing is assumed to be on the machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test lint bench clean test-vision dist-check docs docs-build fuzz

$(VENV)/.installed: pyproject.toml Makefile
	@echo "==> [1/4] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] upgrading pip"
	$(PY) -m pip install --quiet --upgrade pip
	@echo "==> [3/4] installing $(TORCH_PIN) (the CPU build; the longest step)"
	$(PY) -m pip install --progress-bar on "$(TORCH_PIN)"
	@echo "==> [4/4] installing h5forge with all its extras (Prefect, h5py, moto, docs, ...)"
	$(PY) -m pip install --progress-bar on -e ".[all]"
	@echo "==> installed into $(VENV)"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/h5forge demo

# The whole suite: the main tests in .venv, then tests/vision in .venv-vision (below), even
# when the first part fails, so one run reports both.
test: install
	status=0; PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) -m pytest || status=$$?; \
	$(MAKE) --no-print-directory test-vision || { [ $$status -ne 0 ] || status=1; }; \
	[ $$status -eq 0 ] || { echo "make test: failed (exit $$status)"; exit $$status; }

# The property tests of every reader of an untrusted document (issue 28; tests/fixtures/
# documents.py) with fresh random examples, 50 times the fixed-seed budget the suite runs them
# with: the profile "fuzz" of tests/conftest.py. Long (about an hour on 2 cores); a failure
# prints the input that found it, to be kept as a test.
FUZZ_TESTS := $(wildcard tests/h5forge/*/test_documents_properties.py) tests/h5forge/test_documents.py tests/h5forge/read/test_ranges.py
fuzz: install
	$(PY) -m pytest -q -p no:cacheprovider -o timeout=0 --hypothesis-profile=fuzz \
		--hypothesis-show-statistics $(FUZZ_TESTS)

# One format and one lint for the whole tree; CI runs this before the tests.
lint: install
	$(VENV)/bin/ruff format --check h5forge tasks flows deployments tests benchmarks docs/hooks
	$(VENV)/bin/ruff check h5forge tasks flows deployments tests benchmarks docs/hooks
	$(VENV)/bin/mypy h5forge

# The documentation site (mkdocs.yml, docs/): `make docs` serves it at http://127.0.0.1:8000 and
# rebuilds on every change; `make docs-build` builds it once with --strict (a broken link, a
# missing page or a docstring mkdocstrings cannot read fails), into a folder removed afterwards.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

docs-build: install
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$tmp/site"

# The wheel and sdist, installed into fresh venvs outside the checkout (CI runs this).
dist-check: install
	.ci/check-dist

# torchvision beside the project (tests/vision): it needs torch 2.14.1 (the CUDA build, ~5.5 GB;
# torchvision's operators do not load beside the CPU torch of .venv), so it gets its own venv;
# .venv is never touched.
VISION_VENV ?= .venv-vision
VISION_PY   := $(VISION_VENV)/bin/python
VISION_PINS ?= torch==2.14.1 torchvision==0.29.1

$(VISION_VENV)/.installed: pyproject.toml Makefile
	@echo "==> creating $(VISION_VENV) ($(VISION_PINS), then h5forge with the test extra)"
	$(PYTHON) -m venv $(VISION_VENV)
	printf '*\n' > $(VISION_VENV)/.gitignore
	$(VISION_PY) -m pip install --quiet --upgrade pip
	$(VISION_PY) -m pip install --quiet $(VISION_PINS)
	$(VISION_PY) -m pip install --quiet -e ".[test,vision]" $(VISION_PINS)
	touch $@

test-vision: $(VISION_VENV)/.installed
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(VISION_PY) -m pytest -q -p no:cacheprovider tests/vision

clean:
	rm -rf $(VENV) $(VISION_VENV) build dist *.egg-info .pytest_cache
