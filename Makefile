# Sprite OS. Two commands on a fresh machine: `make run` and `make test`.
# Each creates the virtualenv and installs what it needs first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What each target installs: `make run` only dev mode's extra (the mock Bridge), the rest the test extra.
DEV_STAMP := $(VENV)/.installed-dev
TEST_STAMP := $(VENV)/.installed-test
# The console's browser tests drive the distribution's headless Chromium (Playwright comes with the test
# extra): the headless shell, not the full browser, which spends about half again the CPU on the same tests.
# The binary itself: /usr/bin's is a shell script that starts it without exec, a process between
# Playwright and the browser that a kill of it would leave the browser orphaned behind.
# SPRITE_TEST_CHROMIUM names another build (tests/console_browser.py reads it too), which make then uses as it is.
CHROMIUM := $(or $(SPRITE_TEST_CHROMIUM),/usr/lib/chromium/chromium-headless-shell)
# The CLI's sandbox (SPRITE_ISOLATION=sandbox, docs/security.md) runs on bubblewrap, with socat for its
# network proxy; the sandbox mode's tests use them.
SANDBOX := /usr/bin/bwrap /usr/bin/socat
# The chaos suite's faults: a FUSE file system that loses unsynced writes (pyfuse3 builds against
# libfuse3's headers), an ext4 image on a loop device (mkfs.ext4, e2fsck).
FAULT_TOOLS := /usr/include/fuse3/fuse_lowlevel.h /usr/bin/fusermount3 /usr/sbin/mkfs.ext4
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Python keeps what it compiles in __pycache__ (gitignored; deploys and the wheel leave it out). With
# PYTHONDONTWRITEBYTECODE set, every test worker and server process compiled the product, the kits and
# the tests again: about 5 s of CPU a process, half a unit-test worker's start.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast lint bench chaos dist clean screenshots

$(DEV_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(DEV_STAMP)

$(TEST_STAMP): pyproject.toml | $(FAULT_TOOLS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(TEST_STAMP) $(DEV_STAMP)

## Dev mode (devkit/dev_mode.py, run from the checkout: devkit/ is not in the package): serve
## ./.workspace (or SPRITE_WORKSPACE) on :8765 with the embedded demo model (or ANTHROPIC_BASE_URL when set).
run: $(DEV_STAMP)
	$(PY) -m devkit.dev_mode

## Two workers a core: most tests wait more than they compute (on the Claude Code CLI, the browser,
## child processes, backoffs), so a second worker a core fills that time.
WORKERS := $(shell echo $$(( $$(nproc) * 2 )))

## The whole suite, end-to-end tests included (they drive the real Claude Code CLI, and the
## console's in a headless Chromium), on two workers a core (JOBS=1 for one), under coverage.
## The tests that share the host run one after another in their group's worker (tests/README.md).
JOBS ?= $(WORKERS)
PYTEST_PARALLEL := -n $(JOBS) --dist loadgroup
test: $(TEST_STAMP) $(CHROMIUM) $(SANDBOX)
	@rm -f .coverage .coverage.*
	$(PY) -m coverage run -m pytest $(PYTEST_PARALLEL)
	@$(PY) -m coverage combine -q
	$(PY) -m coverage report

## Installed from the distribution's packages when missing (Debian: the `chromium-headless-shell` package).
$(CHROMIUM):
	@echo "Installing the distribution's Chromium for the console's browser tests"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium-headless-shell

## The CLI's sandbox, from the distribution's packages when missing (Debian: bubblewrap, socat).
$(SANDBOX):
	@echo "Installing bubblewrap and socat for the CLI's sandbox"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap socat

## The chaos suite's fault tools, from the distribution's packages when missing (Debian: fuse3,
## libfuse3-dev and pkg-config for pyfuse3's build, e2fsprogs).
$(FAULT_TOOLS):
	@echo "Installing FUSE and e2fsprogs for the chaos suite's disks"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3 libfuse3-dev pkg-config e2fsprogs

## The console's screenshots in docs/console/ (the browser tests take them).
screenshots: $(TEST_STAMP) $(CHROMIUM)
	SPRITE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q tests/test_console_chat_e2e.py \
		tests/test_console_memory_e2e.py tests/test_console_conversation_e2e.py tests/test_console_cards_files_e2e.py \
		tests/test_console_forget_e2e.py

## Unit tests only: no Claude Code CLI, no browser, no pip, no network; no coverage; three workers a
## core (FAST_JOBS). The *_e2e.py modules are not even imported (-m would only deselect them).
## The unit tests mostly wait (on their daemons' threads, child processes, a backoff or a grace
## period): a worker is busy about a third of its time, so a third worker a core fills the rest. At
## most 12: each worker collects every test (about 5 s of CPU), which many cores would pay for nothing.
FAST_JOBS ?= $(shell n=$$(( $$(nproc) * 3 )); echo $$(( n < 12 ? n : 12 )))
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -m "not e2e" --ignore-glob='*_e2e.py' -n $(FAST_JOBS) --dist loadgroup

lint: $(TEST_STAMP)
	$(PY) -m ruff check os_src devkit tests bench chaos bootstrap
	@mkdir -p $(VENV)/typecheck && ln -sfn ../../os_src $(VENV)/typecheck/sprite_os
	$(PY) -m mypy

## Benchmarks: ratios measured side by side in one run; writes bench/results/latest.json.
bench: $(DEV_STAMP)
	$(PY) -m bench

## The fault-injection suite: kill -9s (at chosen moments, and right after a turn_complete), a
## flapping proxy, a freeze, a full disk, locked databases, a slow disk, power cuts, an I/O error,
## a second server, a 5-minute proxy outage and a 1,500-turn run, through the real server and CLI;
## about an hour. The disks and the second server need root (CI has it). Writes
## chaos/results/latest.json and exits 1 if a turn was lost, duplicated or corrupted.
chaos: $(TEST_STAMP)
	$(PY) -m chaos

## The release tarball Bridge deploys: os_src, bootstrap, VERSION, pinned requirements.
dist: $(DEV_STAMP)
	$(PY) bootstrap/build_release.py --out dist

clean:
	rm -rf $(VENV) dist build .pytest_cache .ruff_cache *.egg-info
