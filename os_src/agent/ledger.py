"""The CLI processes a server runs, on disk, so that the next start ends any a killed server left.

A server killed with -9 cannot end its Claude Code CLI: the CLI is left running, and so is
whatever tool it was waiting on (seen: a CLI waiting on a Bash command outlives the server
for as long as the command runs). So each CLI is recorded in `.os/state/cli.json` from the
moment its pid is known (agent/process.py) until it is closed, and the next start (holding
the workspace's writer lock, so no live server's CLI is at stake) ends every process a
recorded CLI started, then the CLI itself.

A recorded pid is trusted only if /proc shows the same process: the same boot, and the same
start time (pids are reused, soon when pid_max is 32768). A CLI that already exited is only
forgotten: nothing else ties its orphans to it safely.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import msgspec

from .. import procfs
from ..fsutil import atomic_write, sweep_temp_files
from ..logs import get_logger

log = get_logger(__name__)

LEDGER_NAME = "cli.json"
REAP_TIMEOUT = 5.0
_lock = threading.Lock()  # a ledger file is rewritten whole: one writer at a time in this process


class Recorded(msgspec.Struct, frozen=True):
    pid: int
    start_time: int  # clock ticks after boot (/proc/<pid>/stat field 22)
    boot_id: str


def descendants(pid: int) -> list[int]:
    """Every live process under `pid`, children first found first."""
    children: dict[int, list[int]] = {}
    for child in procfs.pids():
        if (stat := procfs.stat(child)) is not None:
            children.setdefault(stat.ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class CliLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def for_workspace(root: Path) -> CliLedger:
        return CliLedger(root / ".os" / "state" / LEDGER_NAME)

    def _read(self) -> list[Recorded]:
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=list[Recorded])
        except FileNotFoundError:
            return []
        except (OSError, msgspec.MsgspecError) as exc:
            log.error("cli_ledger_unreadable", path=str(self.path), error=str(exc)[:200])
            return []

    def _write(self, entries: list[Recorded]) -> None:
        if entries:
            atomic_write(self.path, msgspec.json.encode(entries), mode=0o600)
        else:
            self.path.unlink(missing_ok=True)

    def record(self, pid: int) -> None:
        """A CLI started (its pid is known). Blocking: call it off the event loop."""
        found = procfs.stat(pid)
        if found is None:
            return  # already gone
        with _lock:
            entries = [e for e in self._read() if e.pid != pid]
            self._write([*entries, Recorded(pid, found.start_time, procfs.boot_id())])

    def forget(self, pid: int) -> None:
        """The CLI was closed (or killed) by its server. Blocking."""
        with _lock:
            entries = self._read()
            if any(e.pid == pid for e in entries):
                self._write([e for e in entries if e.pid != pid])

    def reap(self) -> list[int]:
        """At start: end every recorded CLI that still runs, and every process it started. Returns
        the pids killed. Blocking (it waits, at most REAP_TIMEOUT, for them to be gone). Call it
        holding the workspace's lock."""
        with _lock:
            sweep_temp_files(self.path.parent, lambda name: name == self.path.name)  # a kill mid-write
            entries = self._read()
            killed: list[int] = []
            boot = procfs.boot_id()
            for entry in entries:
                found = procfs.stat(entry.pid)
                if found is None or not found.alive or entry.boot_id != boot or found.start_time != entry.start_time:
                    continue  # gone, or the pid now names another process
                killed += _kill_tree(entry.pid)
            deadline = time.monotonic() + REAP_TIMEOUT
            while any(procfs.alive(pid) for pid in killed) and time.monotonic() < deadline:
                time.sleep(0.02)
            if killed:
                log.warning("leftover_cli_killed", pids=killed, survivors=[p for p in killed if procfs.alive(p)])
            self._write([])
            return killed


def _kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and everything under it, and the process groups they lead (a tool's shell
    leads its own). Stopped first, so that it starts nothing new meanwhile."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    tree = [pid, *descendants(pid)]
    own_group = os.getpgrp()
    for member in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if (found := procfs.stat(member)) is not None and found.pgid == member and member != own_group:
                os.killpg(member, signal.SIGKILL)
            os.kill(member, signal.SIGKILL)
    return tree
