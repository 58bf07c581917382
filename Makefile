# The two entry points of the README. Torch is pinned and installed first: a plain "torch"
# requirement on a clean machine would resolve to the multi-GB CUDA build. Every command runs through
# $(PY), so `make demo PY=/path/to/venv/bin/python` works without activating that environment.
PY ?= python

.PHONY: setup setup-dev demo test lint

setup:
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[plot]"

setup-dev:
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev,plot,lm]"

demo: setup
	$(PY) -m longsparse_experiments.cli demo

test: setup-dev
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m pytest -q

# style only: the formatter's check and the linter (ruff, pinned in the dev extra)
lint:
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
