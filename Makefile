# Two commands on a fresh machine: `make book` (build the static book) and `make test`.
# Both create and reuse a virtualenv in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed before anything else so that no dependency pulls a different build.
# CPU-only elsewhere:  make TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX ?=

# Offline assets of the static book, fetched from the npm registry at build time (never committed):
# MathJax 3 (math) and the ipywidgets 8 embed manager (widget state in the pages). Pinned here.
MATHJAX_NPM ?= mathjax@3.2.2
WIDGETS_NPM ?= @jupyter-widgets/html-manager@1.0.15
VENDOR ?= book/_static/vendor
NPM ?= npm
ASSETS_STAMP = $(VENDOR)/.fetched-$(subst /,-,$(subst @,-,$(MATHJAX_NPM)+$(WIDGETS_NPM)))
# Headless browser for `make screenshots` (Debian's chromium).
CHROMIUM ?= chromium

.PHONY: book book-assets test train bench clean venv screenshots

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# Warnings are errors: a failing cell, a broken reference or a missing figure fails the build.
# Executed notebooks are cached in _build/.jupyter_cache, so a rebuild reruns only changed ones.
book: venv book-assets
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

book-assets: $(ASSETS_STAMP)

# The stamp names the pinned versions: changing a pin refetches, anything else reuses the copy.
$(ASSETS_STAMP):
	@command -v $(NPM) >/dev/null || { echo "npm is needed to fetch MathJax and the widget manager for the offline book: run 'apt-get install -y npm' (or install Node.js), then 'make book' again." >&2; exit 1; }
	rm -rf $(VENDOR) $(VENDOR).tmp && mkdir -p $(VENDOR).tmp/mathjax $(VENDOR).tmp/html-manager
	cd $(VENDOR).tmp && $(NPM) pack --silent $(MATHJAX_NPM) $(WIDGETS_NPM) >/dev/null
	tar xzf $(VENDOR).tmp/mathjax-*.tgz -C $(VENDOR).tmp/mathjax --strip-components=2 \
	  package/es5/tex-chtml.js package/es5/input/tex package/es5/output/chtml package/es5/ui \
	  package/es5/a11y package/es5/sre
	tar xzf $(VENDOR).tmp/mathjax-*.tgz -C $(VENDOR).tmp/mathjax --strip-components=1 package/LICENSE package/package.json
	tar xzf $(VENDOR).tmp/jupyter-widgets-html-manager-*.tgz -C $(VENDOR).tmp/html-manager --strip-components=2 \
	  --exclude='*.map' --exclude='*amd.js' package/dist
	tar xzf $(VENDOR).tmp/jupyter-widgets-html-manager-*.tgz -C $(VENDOR).tmp/html-manager --strip-components=1 package/package.json
	rm $(VENDOR).tmp/*.tgz && mv $(VENDOR).tmp $(VENDOR) && touch $@

# PNGs of the built landing page and one chapter, opened from file:// by a headless browser with
# the network features off, into screenshots/ (git-ignored). Installs Debian's chromium if needed.
SHOT_PAGES ?= book/intro notebooks/01_attention_only_transformer
screenshots:
	@test -f _build/html/index.html || { echo "no built book: run 'make book' first" >&2; exit 1; }
	@command -v $(CHROMIUM) >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	mkdir -p screenshots
	@for page in $(SHOT_PAGES); do \
	  f=_build/html/$$page.html; \
	  [ -f $$f ] || { echo "no page $$page in _build/html" >&2; exit 1; }; \
	  profile=$$(mktemp -d); out=screenshots/$$(echo $$page | tr / _).png; rm -f $$out; \
	  timeout 120 $(CHROMIUM) --headless --no-sandbox --disable-gpu --disable-background-networking \
	    --disable-component-update --disable-sync --no-first-run --disable-quic --user-data-dir=$$profile \
	    '--host-resolver-rules=MAP * ~NOTFOUND' \
	    --hide-scrollbars --window-size=1300,2400 --virtual-time-budget=10000 \
	    --screenshot=$$out file://$(CURDIR)/$$f 2>/dev/null; rc=$$?; rm -rf $$profile; \
	  [ $$rc -eq 0 ] && [ -s $$out ] || { echo "chromium failed on $$f" >&2; exit 1; }; echo "$$out"; \
	done

# nbval collects notebooks/ recursively: the learner's notebooks/exercises/ run too (stubs: "not attempted yet").
test: venv
	$(VENV)/bin/ruff check src tests benchmarks notebooks book
	$(PY) -m pytest tests
	$(PY) -m pytest --nbval-lax notebooks book/reproduces.ipynb

# Retrain the shipped tokenizer, corpus files and the three models (about 40 min on 2 CPU cores).
train: venv
	cd src && ../$(PY) -m attncircuits.train --prepare-corpus --preset attn-only-0l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset attn-only-1l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset attn-only-2l --threads 1 --overwrite

# Speed and scale measurements, each printing a table; report_models prints the shipped models' numbers.
bench: venv
	for f in benchmarks/report_models.py benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf _build .pytest_cache screenshots $(VENDOR)
	find . -name __pycache__ -prune -exec rm -rf {} +
