"""A test run leaves the host as it found it (devkit/host.py), with the host's paths faked: the first
run in records the kernel settings, their /etc file and the CLI copies; the last one out restores
them; a run removes the users it made, and only those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from devkit import host
from devkit.processes import kit_env

pytest_plugins = ("pytester",)  # an in-process session: a pytest process of its own costs 5 s of CPU under coverage


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sysctls = tmp_path / "proc-sys"
    for name in host.SYSCTLS:
        path = sysctls / name.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("0\n")
    monkeypatch.setattr(host, "_sysctl", lambda name: sysctls / name.replace(".", "/"))
    monkeypatch.setattr(host, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(host, "SYSCTL_CONF", tmp_path / "60-sprite-os.conf")
    monkeypatch.setattr(host, "CLI_CACHE", tmp_path / "lib" / "cli")
    monkeypatch.setattr(host, "own_cli_copy", lambda: tmp_path / "lib" / "cli" / "2.0-new")
    monkeypatch.setattr(host.os, "geteuid", lambda: 0)
    (tmp_path / "lib" / "cli" / "1.0-old").mkdir(parents=True)
    return tmp_path


def change_the_host(root: Path) -> None:
    """What a run's user-mode servers and deploys do."""
    for name in host.SYSCTLS:
        host._sysctl(name).write_text("1\n")
    (root / "60-sprite-os.conf").write_text("fs.protected_hardlinks = 1\n")
    (root / "lib" / "cli" / "2.0-new").mkdir()
    (root / "lib" / "cli" / "2.0-new" / "claude").write_text("#!/bin/sh\n")


def test_the_last_run_out_puts_the_host_back(fake_host: Path) -> None:
    with host.HostLedger(()) as run:
        change_the_host(fake_host)
    assert all(host._sysctl(name).read_text() == "0\n" for name in host.SYSCTLS)
    assert not (fake_host / "60-sprite-os.conf").exists()
    assert sorted(p.name for p in (fake_host / "lib" / "cli").iterdir()) == ["1.0-old"]  # what was there stays
    assert len(run.restored) == len(host.SYSCTLS) + 2  # the settings, the file, the copy
    assert not (fake_host / "runs").exists()  # nor the runs' own folder: the lock and the marks went too


def test_while_another_run_goes_on_nothing_is_put_back_and_it_restores_what_the_first_found(fake_host: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # another checkout's run
    try:
        (fake_host / "runs").mkdir()
        with host.HostLedger(()):
            (fake_host / "runs" / f"{other.pid}.run").touch()  # it started after this one
            change_the_host(fake_host)
        assert host._sysctl("fs.protected_symlinks").read_text() == "1\n"  # still in use by the other run
        assert (fake_host / "runs" / host.BASELINE).exists()
        with host.HostLedger(()):  # a third run, while the other goes on: the first baseline stands
            pass
        (fake_host / "runs" / f"{other.pid}.run").unlink()
        with host.HostLedger(()):
            pass  # the last one out
        assert host._sysctl("fs.protected_symlinks").read_text() == "0\n"
        assert not (fake_host / "60-sprite-os.conf").exists()
    finally:
        other.kill()
        other.wait()


def test_the_copy_of_another_runs_cli_stays_while_that_run_goes_on(fake_host: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # another checkout's run
    try:
        (fake_host / "runs").mkdir()
        with host.HostLedger(()):
            (fake_host / "runs" / f"{other.pid}.run").touch()
            change_the_host(fake_host)
            (fake_host / "lib" / "cli" / "3.0-another-checkout").mkdir()
        assert sorted(p.name for p in (fake_host / "lib" / "cli").iterdir()) == ["1.0-old", "3.0-another-checkout"]
    finally:
        other.kill()
        other.wait()


def test_the_copy_this_run_made_stays_while_another_worker_of_it_may_start_it(fake_host: Path) -> None:
    """The workers of one run share its venv's CLI copy: the first worker out removed it while another
    worker's server was about to start it."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the run's other worker
    try:
        (fake_host / "runs").mkdir()
        with host.HostLedger(()):
            (fake_host / "runs" / f"{other.pid}.run").write_text(json.dumps({"users": [], "cli_copy": "2.0-new"}))
            change_the_host(fake_host)
        assert (fake_host / "lib" / "cli" / "2.0-new" / "claude").is_file()
        (fake_host / "runs" / f"{other.pid}.run").unlink()
        with host.HostLedger(()):
            pass  # the last one out
        assert sorted(p.name for p in (fake_host / "lib" / "cli").iterdir()) == ["1.0-old"]
    finally:
        other.kill()
        other.wait()


def test_a_copy_some_process_runs_is_kept(fake_host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with host.HostLedger(()):
        change_the_host(fake_host)
        running = str(fake_host / "lib" / "cli" / "2.0-new" / "claude")
        monkeypatch.setattr(host.procfs, "exe", lambda pid: running if pid == os.getpid() else "")
    assert (fake_host / "lib" / "cli" / "2.0-new").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="users are made and removed by root")
def test_a_run_removes_the_users_it_made_and_no_other(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sprite_os.deploy_contract import ensure_agent_user

    monkeypatch.setattr(host, "RUNS", tmp_path / "runs")
    made = f"sprite-h{os.getpid()}"
    try:
        with host.HostLedger((made, "root")):
            ensure_agent_user(made)
        assert not host._exists(made) and host._exists("root")
        assert not Path(f"/var/lib/{made}").exists()
    finally:
        if host._exists(made):
            host.remove_user(made)


# Another worker of the same run, in its own process: the host's shared paths are all under `root`.
WORKER = """import sys
from pathlib import Path
from devkit import host
from devkit.processes import kit_env
root = Path(sys.argv[1])
host.RUNS, host.SYSCTL_CONF, host.CLI_CACHE, host.SYSCTLS = root / "runs", root / "conf", root / "cli", ()
host.own_cli_copy = lambda: None
with host.HostLedger((sys.argv[2],)):
    print("in", flush=True)
    sys.stdin.readline()
"""


def test_a_user_the_workers_of_one_run_share_goes_with_the_last_of_them(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """With SPRITE_TEST_AGENT_USER every worker names the same user: the first to finish removed it
    while another's test ran as it ("the agent's user ... does not exist")."""
    from sprite_os.deploy_contract import ensure_agent_user

    for name, value in (("RUNS", tmp_path / "runs"), ("SYSCTL_CONF", tmp_path / "conf"),
                        ("CLI_CACHE", tmp_path / "cli"), ("SYSCTLS", ()), ("own_cli_copy", lambda: None)):
        monkeypatch.setattr(host, name, value)
    made = f"sprite-w{os.getpid()}"
    first = host.HostLedger((made,))
    other = None
    try:
        first.__enter__()
        other = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), made], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=kit_env())
        assert other.stdout is not None and other.stdout.readline() == "in\n"
        ensure_agent_user(made)  # a test in either worker makes it
        first.__exit__(None, None, None)
        assert host._exists(made)  # the other worker goes on with it
        other.communicate("\n", timeout=60)
        assert other.returncode == 0 and not host._exists(made)  # the last one out removed it
    finally:
        if other is not None and other.poll() is None:
            other.kill()
        if host._exists(made):
            host.remove_user(made)


def test_a_run_that_died_without_its_exit_neither_counts_nor_stays(fake_host: Path) -> None:
    """A killed run's mark stayed in the ledger for good; the next run's exit removes it, and restores."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (fake_host / "runs").mkdir()
    (fake_host / "runs" / f"{dead.pid}.run").touch()
    with host.HostLedger(()):
        change_the_host(fake_host)
    assert not (fake_host / "runs" / f"{dead.pid}.run").exists()
    assert all(host._sysctl(name).read_text() == "0\n" for name in host.SYSCTLS)  # the last live run out


def test_the_user_a_dead_run_made_is_removed_by_the_next_run_and_a_live_runs_stays(
        fake_host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test worker that died (CI saw one) never reached its exit: its user (named for its pid, so
    no later run names it) and its mark stayed on the host for good."""
    users = {"sprite-tdead", "sprite-tlive", "sprite-tfound"}
    removed: list[str] = []
    monkeypatch.setattr(host, "_exists", lambda name: name in users)
    monkeypatch.setattr(host, "remove_user", lambda name: (removed.append(name), users.discard(name)))
    runs = fake_host / "runs"
    runs.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (runs / f"{dead.pid}.run").write_text('["sprite-tdead", "sprite-tfound"]')
        (runs / f"{live.pid}.run").write_text('["sprite-tlive"]')
        for name, how in (("sprite-tdead", "made"), ("sprite-tlive", "made"), ("sprite-tfound", "existed")):
            (runs / f"user-{name}").write_text(how)
        with host.HostLedger(()):
            pass
        assert removed == ["sprite-tdead"]  # made by the dead run; the one it found stays a user
        assert not (runs / "user-sprite-tdead").exists() and not (runs / "user-sprite-tfound").exists()
        assert (runs / "user-sprite-tlive").read_text() == "made"  # its run goes on with it
    finally:
        live.kill()
        live.wait()


def test_the_last_run_out_removes_every_cli_copy_made_while_runs_went_on(fake_host: Path) -> None:
    """A deploy test's venv has a CLI of its own, copied under another name than this checkout's:
    it stayed under /var/lib/sprite-os/cli after every run. Copies that were there before stay."""
    with host.HostLedger(()):
        change_the_host(fake_host)
        (fake_host / "lib" / "cli" / "2.0-deployed").mkdir()
        (fake_host / "lib" / "cli" / "2.0-deployed" / "claude").write_text("#!/bin/sh\n")
    assert sorted(p.name for p in (fake_host / "lib" / "cli").iterdir()) == ["1.0-old"]


def test_a_session_removes_its_folder_of_reachable_workspaces(pytester: pytest.Pytester) -> None:
    """The workspaces every user can reach live in the worker's own folder under /tmp, gone with its session
    (a folder all runs shared was left behind by every run)."""
    if os.geteuid() != 0:
        pytest.skip("a workspace another user can reach is made as root (CI runs the suite as root)")
    from tests.conftest import AGENT_TESTS_ROOT

    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest("from tests.conftest import agent_tests_root, reachable_workspace\n")
    pytester.makepyfile(test_toy="""
        import os
        from tests.conftest import AGENT_TESTS_ROOT

        def test_made_in_the_workers_folder(reachable_workspace):
            reachable_workspace.mkdir()
            assert reachable_workspace.parent.parent == AGENT_TESTS_ROOT
            assert str(os.getpid()) in AGENT_TESTS_ROOT.name
        """)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not AGENT_TESTS_ROOT.exists()


def _waiting_on_a_lock(file: Path) -> bool:
    """A blocked request for a lock on `file` (/proc/locks marks waiters with `->`, and names a file
    by its device and inode: `major:minor:inode`, the numbers in hex, hex, decimal)."""
    st = file.stat()
    where = f" {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    return any("->" in line and where in line for line in Path("/proc/locks").read_text().splitlines())


def test_a_run_waiting_while_the_last_one_out_removes_the_lock_takes_the_lock_at_the_path(fake_host: Path) -> None:
    """A run that waited on the lock the last one out removed held a removed file: a third run would
    make a new lock and hold it at the same time."""
    held: list[bool] = []

    def waiting_run() -> None:
        with host._locked():
            held.append((host.RUNS / "lock").exists())

    with host._locked():
        lock = host.RUNS / "lock"
        waiter = threading.Thread(target=waiting_run)
        waiter.start()
        for _ in range(5000):
            if _waiting_on_a_lock(lock):
                break
            threading.Event().wait(0.002)
        assert _waiting_on_a_lock(lock), "the second run never waited on the lock"
        host._leave_nothing()  # the last one out
        assert not (fake_host / "runs").exists()
    waiter.join(timeout=30)
    assert held == [True]  # it holds the lock at the path, not the one removed


def test_the_runs_processes_have_a_home_of_their_own_and_pip_keeps_the_hosts(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The CLIs the run starts get the worker's home (tests/conftest.py's `run_home`), not the host's;
    pip, which read its configuration and cache through the host's HOME, still finds them."""
    assert Path(os.environ["HOME"]).is_relative_to(tmp_path_factory.getbasetemp())
    host_home, home = tmp_path / "host", tmp_path / "home"
    config = host_home / ".config" / "pip" / "pip.conf"
    config.parent.mkdir(parents=True)
    config.write_text("[global]\nfind-links = /the/hosts/wheels\n")
    settings = host.home_settings({"HOME": str(host_home)}, home)
    assert settings == {"HOME": str(home), "PIP_CACHE_DIR": str(host_home / ".cache" / "pip"),
                        "PIP_CONFIG_FILE": str(config)}
    seen = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          check=True, env={**os.environ, **settings}).stdout
    assert "global.find-links='/the/hosts/wheels'" in seen
    # What the host's environment already says of pip's files is its own, HOME aside.
    assert host.home_settings({"HOME": str(host_home), "PIP_CACHE_DIR": "/c", "PIP_CONFIG_FILE": "/f"}, home) == {
        "HOME": str(home)}


def test_a_benchmark_run_gives_its_clis_a_home_of_their_own_and_leaves_the_hosts_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m bench` started its servers' CLIs with the host's HOME: they wrote ~/.claude.json and
    ~/.claude/ there (backups, plugins), which nothing removed. `own_home` gives the run one of its own,
    removed at the end, with the environment as it was."""
    monkeypatch.setenv("HOME", str(tmp_path / "host"))
    for name in ("PIP_CACHE_DIR", "XDG_CACHE_HOME"):  # the run's own set them: a host's shell does not
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    with host.own_home("sprite-bench-home-test-") as home:
        assert os.environ["HOME"] == str(home) and home.is_dir() and home != tmp_path / "host"
        assert os.environ["PIP_CACHE_DIR"] == str(tmp_path / "host" / ".cache" / "pip")
        (home / ".claude.json").write_text("{}")  # what a CLI writes
    assert not home.exists() and dict(os.environ) == before
