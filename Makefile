PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo bench dashboard test lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/medfed demo --out demo_out

# RUNS: run directories or folders of them (make dashboard RUNS="runs/a runs/b"); PORT likewise.
RUNS ?= demo_out
PORT ?= 8501
dashboard: $(STAMP)
	$(BIN)/medfed dashboard $(RUNS) --port $(PORT)

bench: $(STAMP)
	$(BIN)/medfed bench --out bench_out

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check medfed tests dashboard
	$(BIN)/ruff format --check medfed tests dashboard

clean:
	rm -rf demo_out bench_out .pytest_cache .ruff_cache
