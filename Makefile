# Sprite OS. Two commands on a fresh machine: `make run` and `make test`.
# Each creates the virtualenv and installs what it needs first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What each target installs: `make run` only dev mode's extra (the mock Bridge), the rest the test extra.
DEV_STAMP := $(VENV)/.installed-dev
TEST_STAMP := $(VENV)/.installed-test
# The console's browser tests drive the distribution's Chromium (Playwright comes with the test extra).
CHROMIUM := /usr/bin/chromium
# The CLI's sandbox (SPRITE_ISOLATION=sandbox, docs/security.md) runs on bubblewrap, with socat for its
# network proxy; the sandbox mode's tests use them.
SANDBOX := /usr/bin/bwrap /usr/bin/socat
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast lint bench chaos dist clean screenshots

$(DEV_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(DEV_STAMP)

$(TEST_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(TEST_STAMP) $(DEV_STAMP)

## Dev mode (`sprite-os-dev`, from devkit/): serve ./.workspace (or SPRITE_WORKSPACE) on :8765 with the
## embedded demo model (or ANTHROPIC_BASE_URL when set).
run: $(DEV_STAMP)
	$(VENV)/bin/sprite-os-dev

## The whole suite, end-to-end tests included (they drive the real Claude Code CLI, and the
## console's in a headless Chromium), on every core (JOBS=1 for one), under coverage.
JOBS ?= auto
PYTEST_PARALLEL := -n $(JOBS) --dist loadgroup
test: $(TEST_STAMP) $(CHROMIUM) $(SANDBOX)
	@rm -f .coverage .coverage.*
	$(PY) -m coverage run -m pytest $(PYTEST_PARALLEL)
	@$(PY) -m coverage combine -q
	$(PY) -m coverage report

## Installed from the distribution's packages when missing (Debian: the `chromium` package).
$(CHROMIUM):
	@echo "Installing the distribution's Chromium for the console's browser tests"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

## The CLI's sandbox, from the distribution's packages when missing (Debian: bubblewrap, socat).
$(SANDBOX):
	@echo "Installing bubblewrap and socat for the CLI's sandbox"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap socat

## The console's screenshots in docs/console/ (the browser tests take them).
screenshots: $(TEST_STAMP) $(CHROMIUM)
	SPRITE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q tests/test_console_chat_e2e.py \
		tests/test_console_memory_e2e.py tests/test_console_conversation_e2e.py tests/test_console_cards_files_e2e.py \
		tests/test_console_forget_e2e.py

## Unit tests only: no Claude Code CLI, no browser, no pip, no network; on every core, no coverage.
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -m "not e2e" $(PYTEST_PARALLEL)

lint: $(TEST_STAMP)
	$(PY) -m ruff check os_src devkit tests bench chaos bootstrap
	@mkdir -p $(VENV)/typecheck && ln -sfn ../../os_src $(VENV)/typecheck/sprite_os
	$(PY) -m mypy

## Benchmarks: ratios measured side by side in one run; writes bench/results/latest.json.
bench: $(DEV_STAMP)
	$(PY) -m bench

## The fault-injection suite: kill -9s, a flapping proxy, a freeze, a full disk (needs
## root), locked databases and a 500-turn run, through the real server and CLI; ~15 min. Writes
## chaos/results/latest.json and exits 1 if a turn was lost, duplicated or corrupted.
chaos: $(DEV_STAMP)
	$(PY) -m chaos

## The release tarball Bridge deploys: os_src, bootstrap, VERSION, pinned requirements.
dist: $(DEV_STAMP)
	$(PY) bootstrap/build_release.py --out dist

clean:
	rm -rf $(VENV) dist build .pytest_cache .ruff_cache *.egg-info
