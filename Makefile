# Two commands on a fresh machine: `make book` (build the static book) and `make test`.
# Both create and reuse a virtualenv in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed before anything else so that no dependency pulls a different build.
# CPU-only elsewhere:  make TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: book test train clean venv

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

book: venv
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

test: venv
	$(PY) -m pytest tests
	$(PY) -m pytest --nbval-lax notebooks

# Retrain the shipped tokenizer, corpus files and the three models (about 40 min on 2 CPU cores).
train: venv
	cd src && ../$(PY) -m attncircuits.train --prepare-corpus --preset attn-only-0l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset attn-only-1l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset attn-only-2l --threads 1 --overwrite

clean:
	rm -rf _build .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
