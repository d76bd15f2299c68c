# nmt — common tasks. `make demo` sets up and runs the whole pipeline; `make test` runs the tests.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
MIRROR  ?= ../shared/data
# make demo: Tatoeba alone, the validation winner at 20 minutes over the real-data mix
# (configs/small-mix.yaml; docs/BENCHMARKS.md), and served by the hub too.
CONFIG  ?= configs/small.yaml

.PHONY: setup test test-fast test-kinds lint format docs demo demo-medium demo-bt bench clean

$(BIN)/nmt: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch 2.13.0 is on disk on our machines; pin it first so that the
	# package's torch range does not pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,serve,ctranslate2,test,transformers]'
	@touch $(BIN)/nmt

setup: $(BIN)/nmt

test: setup
	$(BIN)/pytest -q -x -rs --durations=10

# The edit loop: everything but the tests marked slow (they train a model or start processes).
test-fast: setup
	$(BIN)/pytest -q -x -m "not slow"

# The numerics-sensitive tests (learning, invariance, precision, int8) once under every kernel set this
# CPU can be capped to (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, NMT_HOST_WITHOUT presets): a table of kind × group.
test-kinds: setup
	$(BIN)/python scripts/test_kinds.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Pages generated from the code: docs/configuration.md from the config schema (nmt/config.py).
docs: setup
	$(BIN)/python scripts/config_reference.py --output docs/configuration.md

# The local mirror is used when its directory exists; otherwise the corpus comes from the hub.
demo: setup
	$(if $(wildcard $(MIRROR)),NMT_MIRROR=$(MIRROR) )$(BIN)/nmt pipeline --config $(CONFIG)
	$(BIN)/python scripts/everyday.py --run runs/$(basename $(notdir $(CONFIG)))
	$(BIN)/nmt translate --run runs/$(basename $(notdir $(CONFIG))) "我爱 AI" "你好，世界。" "我明天要去北京。" "我在2024年买了一部iPhone 15，花了3.5%的工资。" "详情请见https://example.org，谢谢。"
	@echo "Try it in a browser: $(BIN)/nmt serve   (then open http://127.0.0.1:8080/; API docs at /docs)"

# The 60-minute recipe: Tatoeba alone for 60 minutes, the validation winner over the real-data mix at
# that budget too (docs/BENCHMARKS.md), scored on the Tatoeba test and the mirror's newstest2018.
demo-medium: setup
	@test -d $(MIRROR)/wmt-news-zh-en || { echo "demo-medium needs the mirror's wmt-news-zh-en for newstest2018 (MIRROR=$(MIRROR) or NMT_MIRROR)"; exit 1; }
	$(MAKE) demo CONFIG=configs/medium.yaml

# The back-translation recipe: reverse model (en→zh) → back-translate tatoeba-mono-en → forward model on
# real + tagged synthetic pairs. Each step skips what is done, so an interrupted run goes on where it stopped.
demo-bt: setup
	@test -d $(MIRROR)/tatoeba-mono-en || { echo "demo-bt needs the mirror's tatoeba-mono-en (MIRROR=$(MIRROR))"; exit 1; }
	NMT_MIRROR=$(MIRROR) $(BIN)/nmt pipeline --config configs/small-enzh.yaml
	$(BIN)/nmt backtranslate --run runs/small-enzh --mono $(MIRROR)/tatoeba-mono-en --output runs/bt-tatoeba-mono
	NMT_MIRROR=$(MIRROR) $(BIN)/nmt pipeline --config configs/small-bt.yaml
	$(BIN)/nmt translate --run runs/small-bt "我爱 AI" "你好，世界。" "我明天要去北京。"

bench: setup
	$(BIN)/python scripts/bench_train.py
	$(BIN)/python scripts/bench_decode.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
