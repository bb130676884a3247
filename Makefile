# Two commands: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --constraint constraints.txt
DEMO_ARGS ?=

.PHONY: demo test lint typecheck bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip >/dev/null

# setup.py compiles the C kernel into the (editable) install: a changed kernel reinstalls
KERNEL := setup.py src/stepscope/stats/_kernels.c

$(VENV)/.demo-installed: $(VENV)/bin/python pyproject.toml constraints.txt $(KERNEL)
	$(PIP) -e ".[demo,report]"
	touch $@

$(VENV)/.dev-installed: $(VENV)/bin/python pyproject.toml constraints.txt $(KERNEL)
	$(PIP) -e ".[dev,demo,report,tensorboard]"
	# BackPACK pulls in torchvision, whose PyPI wheel cannot load its ops next to the local CPU
	# build of torch ("torchvision::nms does not exist") and then breaks `import lightning` and
	# `transformers`; no test uses torchvision, so the dev environment goes without it.
	$(PY) -m pip uninstall -y -q torchvision || true
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(VENV)/bin/stepscope demo $(DEMO_ARGS)

test: $(VENV)/.dev-installed
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m mypy src/stepscope
	$(PY) -m pytest -q  # tests/test_typing.py: mypy over the README and docs examples

lint: $(VENV)/.dev-installed
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src tests benchmarks

typecheck: $(VENV)/.dev-installed
	$(PY) -m mypy src/stepscope
	$(PY) -m pytest -q tests/test_typing.py

bench: $(VENV)/.dev-installed
	$(PY) benchmarks/kernels.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info src/stepscope/stats/_stepscope_kernels*.so
