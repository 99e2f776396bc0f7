# Two commands on a fresh machine: `make demo` and `make test`.
# Everything lands in ./.venv (the project) and ./.tools (uv itself); nothing global but
# Docker Engine, which `make services` installs and starts when run as root on Debian.

SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
UV    := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)

.PHONY: install demo test lint format services docs docs-check clean

$(UV):
	python3 -m venv .tools && .tools/bin/pip install -q uv

# --compile-bytecode: uv does not byte-compile by default, and where PYTHONDONTWRITEBYTECODE is
# set (this machine's default) nothing ever caches bytecode, so every process recompiled every
# module it imported (for sympy, most of its import time).
$(BIN)/.installed: pyproject.toml uv.lock Makefile | $(UV)
	$(UV) sync --frozen --quiet --compile-bytecode
	@touch $@

# The project's own modules too (cheap: only changed files are recompiled). checked-hash: a
# .pyc is used only if its source's hash matches, so an edited verifier can never run as its
# old bytecode (timestamp checks miss a same-size edit within one second).
install: $(BIN)/.installed
	@$(BIN)/python -m compileall -q --invalidation-mode checked-hash flows scorers tasks warehouse gates workspaces verifiers sweeps

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

# The documentation site (mkdocs.yml): the CLI reference regenerated from the real --help, then
# an offline build in strict mode (a broken link or anchor fails it) into site/.
docs: install
	$(BIN)/python docs/gen_cli.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# What CI runs: a stale CLI reference fails instead of being rewritten.
docs-check: install
	$(BIN)/python docs/gen_cli.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache site
