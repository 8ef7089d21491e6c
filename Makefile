# Two commands: `make run` (the whole service on the embedded tiny default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/var/dagster

$(BIN)/dagster: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: the wheel on these machines' disk; an unpinned torch would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $@

install: $(BIN)/dagster

run: install
	$(BIN)/python server.py --config configs/server.cpu.yaml

# One r2v run in-process, without the service (no workers, no API).
shot: install
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/dagster job execute -m orchestration.definitions -j r2v -c configs/run.r2v.example.yaml
	@echo "MP4 under var/media/r2v/"

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# The single-process tests two at a time (pytest-xdist); the whole-service ones (slow), whose
	# heartbeats and timeouts measure time, alone.
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile
	$(BIN)/python -m pytest -q -m slow

.PHONY: install run shot test
