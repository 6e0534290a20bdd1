# Every target creates .venv from nothing when it is missing; nothing relies on what is installed by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test
ZOO_STAMP := $(VENV)/.installed-zoo

.PHONY: demo test flakes bench zoo clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

$(ZOO_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,zoo]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/tpu-pipeline inspect examples/randwire_small_int8.tflite
	$(VENV)/bin/tpu-pipeline compile examples/randwire_small_int8.tflite -n 4 --verify -o out/randwire_small_int8
	$(VENV)/bin/tpu-pipeline run out/randwire_small_int8 --backend emulator -N 20

test: $(STAMP)
	bash tools/install_system_deps.sh
	$(PY) -m pytest

# the tests about time, 3 runs idle and 3 with every core busy: a machine-speed flake shows here first
flakes: $(STAMP)
	bash tools/install_system_deps.sh
	$(PY) tools/flakes.py --runs 3

zoo: $(ZOO_STAMP)
	$(PY) tools/build_zoo.py --out models

bench: $(ZOO_STAMP)
	$(PY) tools/build_zoo.py --out models
	$(PY) tools/bench.py --models models --out docs/benchmarks.md

clean:
	rm -rf $(VENV) out build *.egg-info
