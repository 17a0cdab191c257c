# daskfeed — every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export KERAS_BACKEND := tensorflow
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test test-slow bench lint clean

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

lint: $(STAMP)
	$(BIN)/python -m pip install --quiet ruff mypy
	$(BIN)/ruff check daskfeed tests bench
	$(BIN)/mypy --ignore-missing-imports daskfeed

clean:
	rm -rf $(VENV) demo-out .pytest_cache
