"""Shared fixtures: a mock Bridge, a workspace, a running Sprite OS, and WebSocket clients.

End-to-end tests run Sprite OS in-process (or as a subprocess where a test must
kill or signal it) with the real Claude Code CLI; the only test double is the
mock Bridge at the HTTP boundary.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpcore2
import pytest
import structlog

from devkit.harness import (
    TOKEN,
    Client,
    Connect,
    client_factory,
    make_settings,
    running,
    wait_for,
)
from devkit.host import HostLedger, home_settings
from devkit.mock_bridge import MockBridge
from devkit.processes import ServerProcess, child_cli_processes, free_port, pid_alive
from sprite_os.config import Settings
from sprite_os.isolation.policy import AgentUser
from tests import xdist_groups

# One TLS context for the test process: httpx builds one for every client (an in-process server's model
# relay and curator), reading the system's CA file each time, about 25 ms of CPU (190 times in the unit
# tests alone); the tests reach the mock Bridge over plain HTTP. Clients share a context safely.
httpcore2.default_ssl_context = functools.cache(httpcore2.default_ssl_context)

if TYPE_CHECKING:  # importing the server loads the agent SDK (seconds): only tests that run it pay
    import asyncio

    from sprite_os.server import SpriteOS
    from tests.console_browser import WorkerBrowser

# ---------------------------------------------------------------- running in parallel (pytest-xdist)
# `make test` runs the suite on every core (-n auto --dist loadgroup). Tests that share something of
# the host's run one after another in one worker: those marked `host`, and those that run the agent as
# its own Unix user when every worker names the same one (a start in `user` mode ends every process of
# that user, another test's agent included), in the group `host`; the deploys as root, in the group
# `deploy`. The two groups
# run beside each other, as two checkouts' runs do: a deploy's agent is the run's deploy user
# (DEPLOY_USER), never the agent's user, and the kernel settings both set are the same.
# tests/README.md says how to write a test that runs well beside others.
HOST_FIXTURES = {"agent_user"}
# The agent's user is the worker's own (AGENT_USER, below, names the worker's process) unless
# SPRITE_TEST_AGENT_USER names one for every worker: only then do the tests that run the agent as that
# user share it, and run in the `host` group. Else they run in any worker, as another checkout's run's
# tests run beside them (their control groups, namespaces and CLI copies are each server's own).
USERS_SHARED = bool(os.environ.get("SPRITE_TEST_AGENT_USER"))
DEPLOY_MODULES = {"test_deploy.py"}
# A test of a real deploy (test_deploy.py's `venv`: pip installs the lock) is end-to-end, so
# `make test-fast` (-m "not e2e") never runs pip.
E2E_FIXTURES = {"venv"}


@pytest.fixture(scope="session", autouse=True)
def anthropic_sdk() -> None:
    """The curator imports the anthropic SDK at its first call (a server's start does not pay it): a
    process that runs tests imports it before its first one (about 2 s of CPU), so that no test's first
    batch spends its deadline on it. A fixture, not an import here: xdist's controller, which runs no
    test, loads this file too."""
    import anthropic  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def run_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The worker's HOME for everything the run starts (the CLIs of its servers, in-process or not, and
    deploys), in the run's temp folder and removed at its end; set before any server starts (a session
    fixture that every test uses). With the host's HOME the CLI's Bash tool ran the host's shell config
    for its snapshot (`bash -l`: a stale pyenv lock there made that take a minute), and the CLI wrote
    ~/.claude.json and ~/.claude/ on the host, a killed CLI leaving its shell snapshot behind. pip keeps
    the host's config and cache (`home_settings`). The `user` isolation gives the agent its own home."""
    home = tmp_path_factory.getbasetemp() / "home"
    home.mkdir(mode=0o700)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in home_settings(os.environ, home).items():
            patch.setenv(name, value)
        try:
            yield home
        finally:
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """What a test's configure_logging (a command's main, run in-process) changed, put back: its
    root handlers, and structlog's cache-on-first-use, which would hide the events of loggers first
    used after it from a later test's capture_logs (failures that depend on the tests' order)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(xdist_groups, "sprite-os-xdist-groups")  # the groups below, held on pytest 9


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        as_agent_user = bool(fixtures & HOST_FIXTURES) or item.get_closest_marker("agent_user") is not None
        if (USERS_SHARED and as_agent_user) or item.get_closest_marker("host"):
            item.add_marker(pytest.mark.xdist_group("host"))
        elif item.path.name in DEPLOY_MODULES:
            item.add_marker(pytest.mark.xdist_group("deploy"))
        # A test of a real server process or the real CLI is e2e by its fixtures, or by its file's name:
        # a module named *_e2e.py that forgot its pytestmark would otherwise slow `make test-fast`.
        if fixtures & E2E_FIXTURES or item.path.name.endswith("_e2e.py"):
            item.add_marker(pytest.mark.e2e)


def observed(workspace: Path, base_url: str, column: str) -> list[tuple[str, object]]:
    """transcript.db's turns, as (the person's message, `column`) in order: what memory recorded."""
    db = sqlite3.connect(make_settings(workspace, base_url).layout.transcript_db)
    try:
        return list(db.execute(f"SELECT user_message, {column} FROM observations ORDER BY id"))
    finally:
        db.close()


__all__ = ["AGENT_USER", "TOKEN", "Client", "Connect", "ServerProcess", "agent_namespace", "child_cli_processes",
           "client_factory", "free_port", "in_namespace", "make_settings", "observed", "pid_alive", "processes_of",
           "running", "wait_for"]


@pytest.fixture
def _function_scoped_runner(_function_scoped_runner: asyncio.Runner,
                            request: pytest.FixtureRequest) -> Iterator[asyncio.Runner]:
    """pytest-asyncio's loop for one test and its function-scoped fixtures (its fixture of this name,
    pytest-asyncio being pinned); for the console's browser tests, the worker's loop instead, where its
    one Chromium lives (tests/console_browser.py). Were the name to change, those tests would each
    launch a browser again: test_console_browser_e2e.py fails then."""
    browser = sys.modules.get("tests.console_browser")  # imported by the modules that drive one
    if browser is None or not browser.drives_a_browser(request.module):
        yield _function_scoped_runner
        return
    worker: WorkerBrowser = request.getfixturevalue("worker_browser")
    yield from worker.test()


@pytest.fixture(scope="session")
def worker_browser(_session_scoped_runner: asyncio.Runner,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerBrowser]:
    from tests.console_browser import worker_browser

    with worker_browser(_session_scoped_runner, tmp_path_factory.getbasetemp()) as worker:
        yield worker


@pytest.fixture
def recall_unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto-recall gives up after AUTO_RECALL_TIMEOUT (0.5 s), so that a turn never waits on it. A test of
    what it recalls is no test of that limit, which a loaded machine misses: then nothing is recalled, and
    a test that something is (or that a forgotten turn is not) fails, or passes for no reason."""
    from sprite_os.memory.recall import service

    monkeypatch.setattr(service, "AUTO_RECALL_TIMEOUT", 60.0)


@pytest.fixture
def quick_curator_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a memory system whose curator's address answers nothing (port 9): a stop's flush, or a
    trigger (a forget's pass), waits for the failed batch's retry (or a conflicted one's), whose run
    makes the daemon's forget pass. 0.4 s, not the backoff's first 2 s: the tests that use it examine
    what the pass does, not when the retry comes (test_daemon.py does)."""
    from sprite_os.memory.curation import daemon as daemon_module

    monkeypatch.setattr(daemon_module, "BACKOFF_FIRST", 0.4)
    monkeypatch.setattr(daemon_module, "BACKOFF_MAX", 0.4)
    monkeypatch.setattr(daemon_module, "CONFLICT_RETRY", 0.4)


@pytest.fixture
def quick_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recall index commits at most once a second (COMMIT_EVERY): a test that records, forgets and
    searches again and again waits a second at each step. One that examines what is found, not the
    commits' pace (test_forget_turns.py, a test of test_recall.py's), has them 0.05 s apart: still held
    back, still one at a time. Not for a test of the commits' pace or of what happens while one is held
    back (test_recall_pacing.py, test_recall.py's held-back commit)."""
    from sprite_os.memory.recall import indexer as indexer_module

    monkeypatch.setattr(indexer_module, "COMMIT_EVERY", 0.05)


@pytest.fixture
async def bridge() -> AsyncIterator[MockBridge]:
    async with MockBridge() as b:
        yield b


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


@pytest.fixture
def settings(workspace: Path, bridge: MockBridge) -> Settings:
    return make_settings(workspace, bridge.url)


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[SpriteOS]:
    async with running(settings) as app:
        yield app


@pytest.fixture
async def client(server: SpriteOS) -> AsyncIterator[Connect]:
    async with client_factory(server.port) as factory:
        yield factory


# ---------------------------------------------------------------- the agent as its own user
# CI runs as root on a fresh machine: these create the agent's user (as bootstrap/deploy.py does) and
# a workspace the agent's user can reach. Without root they skip, saying why.
#
# Each worker's users are its own (`sprite-t<worker pid>`, its deploy user `…-d`): a start on a deployed
# workspace kills every process of its agent's user, so no two workers or checkouts share one. They go at
# the run's end, the last worker out removing them, with whatever else it changed on the host
# (devkit/host.py). SPRITE_TEST_AGENT_USER names one user for every worker instead, and then its tests
# run one at a time in the `host` group.

AGENT_USER = os.environ.get("SPRITE_TEST_AGENT_USER") or f"sprite-t{os.getpid()}"
DEPLOY_USER = f"{AGENT_USER[:30]}-d"  # the deploy tests' (devkit.deploy_support.base_env passes it)
os.environ["SPRITE_TEST_DEPLOY_USER"] = DEPLOY_USER
# pytest's tmp_path is under a 0700 directory the agent's user cannot pass through. The worker's own
# folder, removed at its session's end: a folder all runs shared was left in /tmp after every run.
AGENT_TESTS_ROOT = Path(f"/tmp/sprite-os-agent-tests-{os.getpid()}")


@pytest.fixture(scope="session", autouse=True)
def host() -> Iterator[HostLedger]:
    """The host as this run found it, put back at its end: users, kernel settings, CLI copies."""
    with HostLedger((AGENT_USER, DEPLOY_USER)) as ledger:
        yield ledger


@pytest.fixture(scope="session", autouse=True)
def agent_tests_root() -> Iterator[Path]:
    """The worker's folder of workspaces every user can reach (`reachable_workspace`), removed at the
    session's end."""
    try:
        yield AGENT_TESTS_ROOT
    finally:
        shutil.rmtree(AGENT_TESTS_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def agent_user(host: HostLedger) -> AgentUser:
    """The agent's Unix user, created if missing (idempotent). Skips when the tests are not root."""
    if os.geteuid() != 0:
        pytest.skip("running the agent as its own user needs root (CI runs the suite as root)")
    from sprite_os.deploy_contract import ensure_agent_user
    from sprite_os.isolation.probe import agent_user as lookup

    ensure_agent_user(AGENT_USER)
    found = lookup(AGENT_USER)
    assert found is not None
    return found


@pytest.fixture
def agent_workspace(agent_user: AgentUser, reachable_workspace: Path) -> Path:
    """A fresh workspace path (not yet created) that the agent's user can reach."""
    return reachable_workspace


@pytest.fixture
def reachable_workspace(request: pytest.FixtureRequest, agent_tests_root: Path) -> Iterator[Path]:
    """A fresh workspace path (not yet created) in a directory every user can pass through
    (/tmp/sprite-os-agent-tests-<worker's pid>/<unique>/workspace); removed afterwards. Skips when the tests are
    not root. A deploy's test takes it without `agent_user`: its agent is the deploy's user, and the
    fixture would put it in the `host` group, building the deploys' real venv in a second worker."""
    if os.geteuid() != 0:
        pytest.skip("a workspace another user can reach is made as root (CI runs the suite as root)")
    agent_tests_root.mkdir(mode=0o755, exist_ok=True)
    st = agent_tests_root.stat()
    assert st.st_uid == 0 and not st.st_mode & 0o022, f"{agent_tests_root} must be root's and 0755"
    os.chmod(agent_tests_root, 0o755)
    name = re.sub(r"[^\w.-]", "_", request.node.name)[:40]
    base = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=agent_tests_root))
    os.chmod(base, 0o755)
    try:
        yield base / "workspace"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def agent_settings(agent_workspace: Path, bridge: MockBridge, agent_user: AgentUser) -> Settings:
    """Settings whose agent runs as `agent_user` (SPRITE_ISOLATION=user)."""
    return make_settings(agent_workspace, bridge.url, isolation="user", agent_user=agent_user.name)


@pytest.fixture
async def agent_server(agent_settings: Settings) -> AsyncIterator[SpriteOS]:
    async with running(agent_settings) as app:
        yield app


@pytest.fixture
async def agent_client(agent_server: SpriteOS) -> AsyncIterator[Connect]:
    async with client_factory(agent_server.port) as factory:
        yield factory


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith(("Z", "X")):
            found.append(int(entry.name))
    return found


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def in_namespace(ns: str) -> list[int]:
    """Live processes in the pid namespace `ns` (as /proc/<pid>/ns/pid names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and pid_namespace(int(entry.name)) == ns:
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def agent_namespace(uid: int, workspace: Path) -> str:
    """The pid namespace of the agent's processes working in `workspace` (other tests may run agents too)."""
    for pid in processes_of(uid):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(workspace)) and (ns := pid_namespace(pid)) is not None:
            return ns
    raise AssertionError(f"no process of uid {uid} works in {workspace}")
