# daskfeed — every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export KERAS_BACKEND := tensorflow
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test test-slow bench bench-quick soak lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/daskfeed demo --output demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -ra --runslow tests

# One run, same data and model: in-memory fit, tf.data, the old recipe, daskfeed, feed-only vs
# pyarrow parse (see daskfeed/bench.py). Data generated once per size under bench-out/.
BENCH_ROWS   ?= 2000000
BENCH_MEMORY ?= 4GB
bench: $(STAMP)
	$(BIN)/daskfeed bench --rows $(BENCH_ROWS) --memory-limit $(BENCH_MEMORY) \
		--data-dir bench-out/data-$(BENCH_ROWS) --json bench-out/bench-$(BENCH_ROWS).json

# memory soak: daskfeed train --memory-limit 2GB over 1x, 4x, 6.25x, 8x the budget (tests/test_soak.py)
soak: $(STAMP)
	DASKFEED_SOAK_DIR=$${DASKFEED_SOAK_DIR:-soak-out} $(BIN)/python -m pytest -q -ra --runslow -s tests/test_soak.py

bench-quick:
	$(MAKE) bench BENCH_ROWS=200000

lint: $(STAMP)
	$(BIN)/python -m pip install --quiet ruff mypy
	$(BIN)/ruff check daskfeed tests
	$(BIN)/mypy --ignore-missing-imports daskfeed

clean:
	rm -rf $(VENV) demo-out .pytest_cache
