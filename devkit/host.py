"""What a test run changes on the host, put back when it ends (tests/conftest.py holds one).

Tests that run the agent as its own user, as root, change the machine: they make Unix users, set
kernel settings (deploy_contract.SYSCTLS) and their /etc/sysctl.d file, and copy the CLI under
/var/lib/sprite-os/cli. A run's users are its own (named for it), and removed at its end if it
made them: its workers (pytest-xdist's, each a run here) may share them (SPRITE_TEST_AGENT_USER),
so the first in records whether each existed and the last one out of those that name it removes
it, never one while another worker uses it; the users of a run that died before its end go at the
next run's end. So is the copy of its own venv's CLI, and the last run out removes every copy made while
runs went on (a deploy test's venv has its own) that no process runs. The
kernel settings are shared by every run on the machine, and two checkouts may test at once: the
first run in records how the host was, and the last one out restores it (runs find each other by
their pid files under RUNS, under a lock; the last one out removes RUNS too). Root only; without
root a run changes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sprite_os import procfs
from sprite_os.deploy_contract import SYSCTLS
from sprite_os.isolation import cgroups
from sprite_os.isolation.launch import CLI_CACHE, cli_copy, kill_processes_of

RUNS = Path("/run/sprite-os-test-runs")
SYSCTL_CONF = Path("/etc/sysctl.d/60-sprite-os.conf")  # what bootstrap/deploy.py writes
BASELINE = "baseline.json"


def _sysctl(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def snapshot() -> dict[str, Any]:
    """How the host is now, in what test runs share."""
    conf = SYSCTL_CONF.read_text() if SYSCTL_CONF.is_file() else None
    return {"sysctls": {name: _sysctl(name).read_text().strip() for name in SYSCTLS}, "sysctl_conf": conf,
            "cli_cache": CLI_CACHE.exists(), "cli_cache_parent": CLI_CACHE.parent.exists(),
            "cli_copies": sorted(p.name for p in CLI_CACHE.iterdir()) if CLI_CACHE.is_dir() else []}


def restore(baseline: dict[str, Any]) -> list[str]:
    """Put the host back as `baseline` found it; what was changed back."""
    done = []
    for name, value in baseline["sysctls"].items():
        if _sysctl(name).read_text().strip() != value:
            _sysctl(name).write_text(value + "\n")
            done.append(f"{name}={value}")
    conf = baseline["sysctl_conf"]
    if conf is None and SYSCTL_CONF.exists():
        SYSCTL_CONF.unlink()
        done.append(f"removed {SYSCTL_CONF}")
    elif conf is not None and (not SYSCTL_CONF.is_file() or SYSCTL_CONF.read_text() != conf):
        SYSCTL_CONF.write_text(conf)
        done.append(f"restored {SYSCTL_CONF}")
    # Copies made while the runs went on, of other venvs' CLIs too (a deploy test's own venv): the
    # last run out removes those no process runs, as it puts the settings back.
    if CLI_CACHE.is_dir():
        for copy in CLI_CACHE.iterdir():
            if copy.name not in baseline.get("cli_copies", []) and remove_copy(copy):
                done.append(f"removed {copy}")
    for directory, existed in ((CLI_CACHE, baseline["cli_cache"]), (CLI_CACHE.parent, baseline["cli_cache_parent"])):
        if not existed:
            with contextlib.suppress(OSError):
                directory.rmdir()  # only if empty: another run's or program's files stay
                done.append(f"removed {directory}")
    return done


def own_cli_copy() -> Path | None:
    """Where this venv's CLI is copied for the agent's user (isolation/launch.py), if it bundles
    one; found without importing the SDK (seconds), which a unit-test run never needs."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or spec.origin is None:
        return None
    try:
        return cli_copy((Path(spec.origin).parent / "_bundled" / "claude").resolve(), CLI_CACHE).parent
    except OSError:
        return None


def remove_copy(copy: Path) -> bool:
    """Remove a CLI copy no process runs."""
    if not copy.is_dir() or str(copy / "claude") in {procfs.exe(pid) for pid in procfs.pids()}:
        return False
    shutil.rmtree(copy, ignore_errors=True)
    return True


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The runs' lock. The last run out removes it with the folder, under the lock: a run that was
    waiting then holds a removed file, so it takes the lock again until the one it holds is the one
    at the path."""
    while True:
        RUNS.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            lock = open(RUNS / "lock", "w")
        except FileNotFoundError:  # the folder went between the two calls
            continue
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(RUNS / "lock").st_ino == os.fstat(lock.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield
                return


def _leave_nothing() -> None:
    """The last run out removes the lock, then the folder if nothing else is in it. Only as the last
    step under the lock: once the file is gone, a newcomer makes a new one and goes in. (A checkout
    older than this rule, waiting on the lock then, would hold the removed file: update both.)"""
    (RUNS / "lock").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        RUNS.rmdir()


def _marks_of(runs: list[int]) -> tuple[set[str], set[str]]:
    """The users the live `runs` may make and the CLI copies they may run (each run's mark lists them;
    a mark that is a bare list is an older checkout's, which names its users only)."""
    names: set[str] = set()
    copies: set[str] = set()
    for pid in runs:
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            mark = json.loads((RUNS / f"{pid}.run").read_text() or "[]")
            if isinstance(mark, list):
                names.update(mark)
            else:
                names.update(mark["users"])
                copies.update([mark["cli_copy"]] if mark.get("cli_copy") else [])
    return names, copies


def _user_mark(name: str) -> Path:
    return RUNS / f"user-{name}"


def _live_runs() -> list[int]:
    """The runs still going; the marks of runs that died without their exit (a killed `make test`)
    are removed, so they neither count nor stay behind."""
    live = []
    for mark in RUNS.glob("*.run"):
        if mark.stem.isdigit() and procfs.alive(int(mark.stem)):
            live.append(int(mark.stem))
        else:
            mark.unlink(missing_ok=True)
    return live


class HostLedger:
    """`with HostLedger(users) as host:` around a test run; `users`: the names the run may make."""

    def __init__(self, users: tuple[str, ...]) -> None:
        self.users = users
        self._existed: set[str] = set()
        self._copy: Path | None = None
        self._copy_existed = True
        self.restored: list[str] = []
        self.active = os.geteuid() == 0

    def __enter__(self) -> HostLedger:
        if not self.active:
            return self
        self._existed = {name for name in self.users if _exists(name)}
        self._copy = own_cli_copy()
        self._copy_existed = self._copy is not None and self._copy.exists()
        with _locked():
            if not (RUNS / BASELINE).exists():  # else another run's, or one that died before it could restore
                (RUNS / BASELINE).write_text(json.dumps(snapshot()))
            shared = _marks_of(_live_runs())[0]
            for name in self.users:
                if name not in shared:  # the first in of the runs that name it: how it found the user
                    _user_mark(name).write_text("existed" if name in self._existed else "made")
            (RUNS / f"{os.getpid()}.run").write_text(json.dumps(
                {"users": list(self.users), "cli_copy": None if self._copy is None else self._copy.name}))
        return self

    def __exit__(self, *_: object) -> None:
        if not self.active:
            return
        cgroups.remove_groups_of(os.getpid())
        with _locked():
            (RUNS / f"{os.getpid()}.run").unlink(missing_ok=True)
            live = _live_runs()
            in_use, copies_in_use = _marks_of(live)
            # The copy this run made goes with it, unless another run (this run's other workers, which
            # share its venv's CLI) may still start it: that one's last worker out removes it.
            if (self._copy is not None and not self._copy_existed and self._copy.name not in copies_in_use
                    and remove_copy(self._copy)):
                self.restored.append(f"removed {self._copy}")
            for name in self.users:
                if name in in_use:  # another worker of this run goes on with it: the last one out removes it
                    continue
                mark = _user_mark(name)
                made = mark.read_text() == "made" if mark.is_file() else name not in self._existed
                mark.unlink(missing_ok=True)
                if made and _exists(name):
                    remove_user(name)
                    self.restored.append(f"removed user {name}")
            self._remove_orphans(in_use)
            if not live:  # the last run out
                with contextlib.suppress(OSError, ValueError):
                    self.restored += restore(json.loads((RUNS / BASELINE).read_text()))
                (RUNS / BASELINE).unlink(missing_ok=True)
                _leave_nothing()


    def _remove_orphans(self, in_use: set[str]) -> None:
        """The users of runs that died without their exit (a killed worker): each is named for its
        run, so no later run would ever remove it. Made by that run: removed; found: left, unmarked."""
        for mark in RUNS.glob("user-*"):
            name = mark.name.removeprefix("user-")
            if name in in_use or name in self.users:
                continue
            made = mark.read_text() == "made"
            mark.unlink(missing_ok=True)
            if made and _exists(name):
                remove_user(name)
                self.restored.append(f"removed user {name}, left by a run that died")


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def remove_user(name: str) -> None:
    """End the user's processes, then remove it, its group and its home. Root only."""
    entry = pwd.getpwnam(name)
    for _ in range(3):
        if not kill_processes_of(entry.pw_uid):
            break
    subprocess.run(["userdel", name], capture_output=True, check=False)
    shutil.rmtree(entry.pw_dir, ignore_errors=True)


def home_settings(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """The variables that give the run's processes `home` for HOME, and keep what the host's HOME gave
    them that the run needs: pip's configuration (where the wheels come from: a mirror, local wheels)
    and its cache (the deploy tests' `pip download` is fast and offline from it)."""
    host = Path(environ.get("HOME") or Path.home())
    settings = {"HOME": str(home)}
    if "PIP_CACHE_DIR" not in environ and "XDG_CACHE_HOME" not in environ:
        settings["PIP_CACHE_DIR"] = str(host / ".cache" / "pip")
    if "PIP_CONFIG_FILE" not in environ and "XDG_CONFIG_HOME" not in environ:
        found = [f for f in (host / ".config" / "pip" / "pip.conf", host / ".pip" / "pip.conf") if f.is_file()]
        settings.update({"PIP_CONFIG_FILE": str(found[0])} if found else {})
    return settings


@contextlib.contextmanager
def own_home(prefix: str) -> Iterator[Path]:
    """A HOME of its own for the block (its CLIs write ~/.claude.json and ~/.claude/ there, not in the
    host's), with the host's pip settings (`home_settings`), removed at its end: for a run outside pytest
    (`python -m bench`); the tests' run has conftest's `run_home`."""
    saved = dict(os.environ)
    home = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        os.environ.update(home_settings(saved, home))
        yield home
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(home, ignore_errors=True)
