# daskfeed — every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export KERAS_BACKEND := tensorflow
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test test-slow test-torch bench bench-quick bench-shuffle bench-grow bench-quoted soak lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/daskfeed demo --output demo-out

# two test files at a time (pytest-xdist): most tests wait on processes they start, and each
# file's fixtures (clusters, trained runs) are built once per file
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra -n 2 --dist loadfile --durations=15 tests

# the slow tier: README commands, resume, faults, S3, ranks, deploy, TLS, signals and the dashboard
# in headless Chromium (Debian's package, installed here; missing, the browser test fails). The
# memory soak and the benchmarks stay in make soak / make bench. CI runs it after make test.
test-slow: $(STAMP)
	sh scripts/install-browser.sh
	DASKFEED_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q -ra -n 2 --dist loadfile --runslow --durations=15 \
		-m slow tests --ignore=tests/e2e/test_soak.py --ignore=tests/e2e/test_bench.py

# KERAS_BACKEND=torch and daskfeed.TorchDataset: the torch extra, the CPU wheel first (TORCH_PIN, found
# in pip's find-links; measured: 13.8 s, +762 MB) and, where it is not found, the extra as the index
# has it (CUDA wheels: several GB); then the torch tests and the backend matrix's torch runs, which
# fail rather than skip without torch (DASKFEED_REQUIRE_TORCH=1). CI runs it after make test.
TORCH_PIN   ?= torch==2.13.0+cpu
# CI sets TORCH_SLOW empty: its slow tier, run after this with torch installed, runs the slow ones
TORCH_SLOW  ?= --runslow
TORCH_STAMP := $(VENV)/.torch-installed
$(TORCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[torch]" "$(TORCH_PIN)" \
		|| $(BIN)/python -m pip install --quiet -e ".[torch]"
	touch $(TORCH_STAMP)

test-torch: $(TORCH_STAMP)
	DASKFEED_REQUIRE_TORCH=1 $(BIN)/python -m pytest -q -ra -n 2 --dist loadfile $(TORCH_SLOW) \
		--durations=15 tests/adapters/test_torch.py tests/backends -k torch

# One run, same data and model: in-memory fit before and after daskfeed (A-B-A), tf.data (no cache,
# .cache(file), .cache()), the old recipe, daskfeed, feed-only vs pyarrow parse (benchmarks/bench.py).
# Data generated once per size under bench-out/; results (JSON, PNG, text) in benchmarks/results/.
BENCH_ROWS   ?= 2000000
BENCH_MEMORY ?= 4GB
BENCH_STAMP  := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench.py --rows $(BENCH_ROWS) --memory-limit $(BENCH_MEMORY)

# memory soak: daskfeed train --memory-limit 2GB over 1x, 4x, 6.665x (13.33 GB), 8x the budget (tests/e2e/test_soak.py)
soak: $(STAMP)
	DASKFEED_SOAK_DIR=$${DASKFEED_SOAK_DIR:-soak-out} $(BIN)/python -m pytest -q -ra --runslow -s tests/e2e/test_soak.py

bench-quick:
	$(MAKE) bench BENCH_ROWS=200000

# shuffle quality on label-sorted data and validation loss sorted vs pre-shuffled (issue 33's targets)
bench-shuffle: $(BENCH_STAMP)
	$(BIN)/python benchmarks/shuffle.py

# data that grows: a scan after 1 % new files vs a full scan; deciding over 100,000 files (issue 28)
bench-grow: $(BENCH_STAMP)
	$(BIN)/python benchmarks/grow.py

# one 1 GB CSV with quoted line breaks in 10 % of rows vs the same without: scan rate (issue 31)
bench-quoted: $(BENCH_STAMP)
	$(BIN)/python benchmarks/quoted.py

LINT_STAMP := $(VENV)/.lint-installed
$(LINT_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[lint]"
	touch $(LINT_STAMP)

# style, types and the import contracts in pyproject.toml ([tool.importlinter]: layers, keras only
# above the batch core, private modules behind each subpackage's __init__)
# the stages below the Keras glue are type-checked strictly (the rest is typed, not yet strict)
STRICT := daskfeed/core daskfeed/cluster daskfeed/cache daskfeed/manifest daskfeed/batches \
	daskfeed/checkpoint

lint: $(LINT_STAMP)
	$(BIN)/ruff check daskfeed tests benchmarks scripts
	$(BIN)/lint-imports
	$(BIN)/mypy --ignore-missing-imports daskfeed benchmarks
	$(BIN)/mypy --strict --follow-imports=silent --ignore-missing-imports $(STRICT)

clean:
	rm -rf $(VENV) demo-out .pytest_cache
