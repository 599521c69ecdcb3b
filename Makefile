# Two commands on a fresh machine with Python >= 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test ui browser servers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/optimizer-pipeline demo

test: $(STAMP) browser servers
	$(BIN)/python -m pytest -q

# headless Chromium + chromedriver for the UI test (Debian packages; installed when missing)
browser:
	bash .ci/ensure-chromium

# redis-server and PostgreSQL binaries for the tests that start throwaway servers (installed when missing)
servers:
	bash .ci/ensure-servers

ui: $(STAMP)
	$(BIN)/optimizer-pipeline ui

clean:
	rm -rf $(VENV) .optimizer .pytest_cache
