"""The CLI ledger: a recorded CLI still running at the next start is ended with everything it
started; a pid that now names another process is never touched."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.harness import wait_for
from sprite_os.agent.ledger import CliLedger, descendants
from tests.conftest import pid_alive

# A stand-in for a CLI waiting on a tool: a child in a process group of its own, like a tool's shell.
CLI = ("import subprocess, sys, time\n"
       "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
       "time.sleep(600)\n")


@pytest.fixture
def cli() -> Iterator[subprocess.Popen[bytes]]:
    """The stand-in, once its tool runs. (A teardown that looked for the tool before the stand-in had
    started it left the tool behind, in a session of its own, for ten minutes.)"""
    proc = subprocess.Popen([sys.executable, "-c", CLI])
    try:
        asyncio.run(wait_for(lambda: descendants(proc.pid), timeout=30, what="the stand-in CLI's tool process"))
        yield proc
    finally:
        for pid in [proc.pid, *descendants(proc.pid)]:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
        proc.wait()


def test_a_recorded_cli_still_running_is_ended_with_what_it_started(tmp_path: Path,
                                                                    cli: subprocess.Popen[bytes]) -> None:
    ledger = CliLedger.for_workspace(tmp_path)
    ledger.record(cli.pid)
    [tool] = descendants(cli.pid)
    assert [e["pid"] for e in json.loads(ledger.path.read_text())] == [cli.pid]
    assert sorted(ledger.reap()) == sorted([cli.pid, tool])
    cli.wait(5)
    assert not pid_alive(tool) and not ledger.path.exists()


def test_a_forgotten_cli_or_a_reused_pid_or_another_boot_is_never_touched(tmp_path: Path,
                                                                          cli: subprocess.Popen[bytes]) -> None:
    ledger = CliLedger.for_workspace(tmp_path)
    ledger.record(cli.pid)
    ledger.forget(cli.pid)  # closed by its server
    assert ledger.reap() == [] and pid_alive(cli.pid)
    for field, value in (("start_time", 1), ("boot_id", "another-boot")):
        ledger.record(cli.pid)
        entries = json.loads(ledger.path.read_text())
        entries[0][field] = value  # the pid now names a process that started at another time
        ledger.path.write_text(json.dumps(entries))
        assert ledger.reap() == [] and pid_alive(cli.pid)
    ledger.path.write_text("{broken")
    assert ledger.reap() == [] and pid_alive(cli.pid)  # unreadable: logged, nothing killed
