PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest exits 5 when it collected no tests: a failure of the suite too, and said so (make
# itself then exits 2, so callers only see that the tests failed).
PYTEST_FAILED = { rc=$$?; [ $$rc -ne 5 ] || echo "pytest collected no tests" >&2; exit $$rc; }

.PHONY: demo bench gpu-check gpu-wheels dashboard test test-fast lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# '.[dev]' = every extra (flower, dashboard, lora, bench) + the test and lint tools.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# MODALITY: fundus (the default), ct or all (make demo MODALITY=ct).
MODALITY ?= fundus
demo: $(STAMP)
	$(BIN)/medfed demo --out demo_out --modality $(MODALITY)

# RUNS: run directories or folders of them (make dashboard RUNS="runs/a runs/b"); PORT likewise.
RUNS ?= demo_out
PORT ?= 8501
dashboard: $(STAMP)
	$(BIN)/medfed dashboard $(RUNS) --port $(PORT)

bench: $(STAMP)
	$(BIN)/medfed bench --out bench_out

# The GPU path end to end (docs/development.md, "GPU check"); on a machine without CUDA it
# checks the CPU's bf16 autocast instead. On a machine with its own Python and torch: python3 -m medfed gpu-check.
gpu-check: $(STAMP)
	$(BIN)/medfed gpu-check --out gpu_check_out

# Wheels for a GPU machine that has Python 3.12, torch, numpy, scipy, scikit-learn,
# scikit-image, pandas, typer and safetensors but not the rest of medfed's needs; they go to
# .whl/ (ignored by git). There: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
GPU_WHEELS := monai==1.6.1 pydicom==3.0.2 nibabel==5.4.2 tomli-w==1.2.0 opacus==1.6.0 \
	opt-einsum==3.4.0 defusedxml==0.7.1 openpyxl==3.1.5 et-xmlfile==2.0.0
gpu-wheels: $(STAMP)
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)

# Everything (what CI runs): slow tests, a real Flower deployment, the dashboard in Chromium.
# Four streams side by side, each with its own temporary folder and log, all must pass:
# - the Flower deployment tests but FLOWER_MORE (they mostly wait on their own processes), then
#   FLOWER_ALSO;
# - FLOWER_MORE, then MORE_TESTS (long tests that wait on a browser or a fresh interpreter);
# - SIDE_TESTS (long whole-command and engine test files);
# - the rest.
# The first three streams' output follows the rest's. The lists keep the four about as long.
SIDE_TESTS := tests/test_bench.py tests/test_engine.py tests/test_privacy.py tests/test_synth.py \
	tests/test_compile.py tests/test_scenarios.py tests/test_dr_training.py \
	tests/test_tv_backbones.py tests/test_serve_load.py tests/test_pacs_dicomweb.py
FLOWER_MORE := tests/test_bench_deploy.py
MORE_TESTS := tests/test_dashboard_browser.py tests/test_bad_inputs_dashboard.py \
	tests/test_extras.py tests/test_pfedme.py tests/test_fedgmi.py tests/test_transfer.py \
	tests/test_demo_ct.py tests/test_privacy_curve.py tests/test_pacs_finding.py \
	tests/test_frozen_encoder.py tests/test_realdata_study.py
FLOWER_ALSO := tests/test_backbones_slices.py tests/test_routing.py tests/test_worker.py \
	tests/test_secure_aggregation.py tests/test_onboarding.py tests/test_gpu_check.py \
	tests/test_demo_pinned.py
PYTEST_ALONGSIDE := $(BIN)/python -m pytest -q -p no:cacheprovider --durations=10
# The Flower tests wait on chains of short steps (a SuperNode's poll, a fresh ClientApp process,
# a reply); every other test runs at a lower priority, so that the CPU-bound ones fill the cores
# between those steps instead of stretching each chain.
LOWER := nice -n 10
test: $(STAMP)
	@tmp=$$(mktemp -d); \
	{ $(PYTEST_ALONGSIDE) -m flower --basetemp="$$tmp/flower" \
		$(foreach t,$(FLOWER_MORE),--ignore=$(t)); a=$$?; \
	  $(LOWER) $(PYTEST_ALONGSIDE) -m "not flower" --basetemp="$$tmp/also" $(FLOWER_ALSO); \
	  b=$$?; [ $$a -ne 0 ] && exit $$a; exit $$b; } > "$$tmp/flower.log" 2>&1 & flower=$$!; \
	{ $(PYTEST_ALONGSIDE) --basetemp="$$tmp/more" $(FLOWER_MORE); a=$$?; \
	  $(LOWER) $(PYTEST_ALONGSIDE) --basetemp="$$tmp/more_also" $(MORE_TESTS); b=$$?; \
	  [ $$a -ne 0 ] && exit $$a; exit $$b; } > "$$tmp/more.log" 2>&1 & more=$$!; \
	$(LOWER) $(PYTEST_ALONGSIDE) -m "not flower" --basetemp="$$tmp/side" $(SIDE_TESTS) \
		> "$$tmp/side.log" 2>&1 & side=$$!; \
	$(LOWER) $(BIN)/python -m pytest -q -m "not flower" --durations=25 \
		$(foreach t,$(SIDE_TESTS) $(MORE_TESTS) $(FLOWER_ALSO),--ignore=$(t)); rc=$$?; \
	wait $$flower; frc=$$?; wait $$more; mrc=$$?; wait $$side; src=$$?; \
	echo "--- Flower deployment tests, then $(FLOWER_ALSO) (run alongside the others) ---"; \
	cat "$$tmp/flower.log"; \
	echo "--- $(FLOWER_MORE) $(MORE_TESTS) (run alongside the others) ---"; \
	cat "$$tmp/more.log"; \
	echo "--- $(SIDE_TESTS) (run alongside the others) ---"; cat "$$tmp/side.log"; \
	rm -rf "$$tmp"; \
	for code in $$rc $$frc $$mrc $$src; do \
		[ $$code -ne 5 ] || echo "pytest collected no tests" >&2; done; \
	[ $$rc -eq 0 ] && [ $$frc -eq 0 ] && [ $$mrc -eq 0 ] && [ $$src -eq 0 ]

# The quick loop while editing: leaves out the slow, Flower and browser tests.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not flower and not browser" || $(PYTEST_FAILED)

lint: $(STAMP)
	$(BIN)/ruff check medfed tests
	$(BIN)/ruff format --check medfed tests

clean:
	rm -rf demo_out bench_out gpu_check_out .pytest_cache .ruff_cache
