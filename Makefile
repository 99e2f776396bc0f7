# Two commands on a fresh machine: `make demo` and `make test`.
# Everything lands in ./.venv (the project) and ./.tools (uv itself); nothing global but
# Docker Engine, which `make services` installs and starts when run as root on Debian.

SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
UV    := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)

.PHONY: install demo test test-times lint format services docs docs-check clean

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
	bash infra/docker/ensure_compose.sh $(VENV)
	$(BIN)/gradebook sandbox build
	bash infra/install_chromium.sh

# `make test`: ruff, the services, then the suite in two pytest runs: every test not marked
# `serial` on TEST_WORKERS pytest-xdist workers (one per core, at least 2; each is a test session
# of its own, as a second checkout's is: tests/conftest.py), then the `serial` ones alone (they
# bound a wall-clock time). Both runs always run; the exit code is 0 only if both passed (one
# that selected no test, exit 5, passes as long as the other ran some).
# Last, where the time went: each phase's wall time and the 10 slowest tests
# (`make test-times` prints the whole table again, per file). PYTEST_ARGS goes to both runs.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 2 ? 2 : n )))
TIMES := .test-times
# `$(call timed,NAME,COMMAND)`: run COMMAND, append "NAME<TAB>seconds" to the phases file
timed = t0=$$EPOCHREALTIME; $(2); rc=$$?; \
	echo "$(1)	$$(awk "BEGIN {print $$EPOCHREALTIME - $$t0}")" >> $(TIMES)/phases.tsv; (exit $$rc)

test:
	@rm -rf $(TIMES) && mkdir -p $(TIMES)
	@$(call timed,install,$(MAKE) --no-print-directory install)
	@$(call timed,lint,$(MAKE) --no-print-directory lint)
	@$(call timed,services,$(MAKE) --no-print-directory services)
	@$(call timed,pytest -n $(TEST_WORKERS),$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile \
		-m "not serial" --junitxml=$(TIMES)/parallel.xml $(PYTEST_ARGS)); a=$$?; \
	$(call timed,pytest serial,$(BIN)/pytest -p no:xdist -m serial \
		--junitxml=$(TIMES)/serial.xml $(PYTEST_ARGS)); b=$$?; \
	echo; $(BIN)/python tests/timing_report.py $(TIMES)/*.xml --phases $(TIMES)/phases.tsv \
		--files 0 --slowest 10; \
	[ $$a = 5 ] && [ $$b = 5 ] && exit 5; \
	[ $$a = 5 ] && a=0; [ $$b = 5 ] && b=0; \
	exit $$(( a || b ))

# Where the last `make test` spent its time: phases, every test file, the 20 slowest tests.
test-times:
	@$(BIN)/python tests/timing_report.py $(TIMES)/*.xml --phases $(TIMES)/phases.tsv

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
