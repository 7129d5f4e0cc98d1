# Each target is a one-liner over the real commands (README.md explains them).
PYTHON ?= python3

.PHONY: setup run test test-slow bench lint migrate

setup:
	$(PYTHON) -m pip install -e '.[dev]'

run:
	contentsvc run

migrate:
	contentsvc migrate

test:
	$(PYTHON) -m pytest -q

test-slow:
	$(PYTHON) -m pytest -q -m slow

bench:
	contentsvc bench ingest

lint:
	$(PYTHON) -m compileall -q src projectors bench tests
