# Two commands on a fresh machine: `make demo` and `make test`.
# Everything lands in ./.venv (the project) and ./.tools (uv itself); nothing global but
# Docker Engine, which `make services` installs and starts when run as root on Debian.

SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
UV    := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)

.PHONY: install demo test lint format services clean

$(UV):
	python3 -m venv .tools && .tools/bin/pip install -q uv

$(BIN)/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --quiet
	@touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/gradebook demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Services the tests need (Docker Engine + the sandbox image); each script says what it does.
services: install
	bash infra/docker/ensure_docker.sh
	$(BIN)/gradebook sandbox build
	bash infra/install_chromium.sh

test: lint services
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache
