"""Sprite OS as a child process, and the Claude Code CLIs around it, for the tests and the chaos
suite that signal, kill or freeze them (`running` in harness.py runs the server in-process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sprite_os import procfs
from sprite_os.errors import SpriteOSError

from .harness import TEST_RATE, TOKEN

CHECKOUT = Path(__file__).resolve().parents[1]


def kit_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the checkout first on PYTHONPATH. devkit/, tests/, bench/
    and chaos/ are not installed (the package ships the product only): a child that runs one of
    them (`python -m devkit.lazyfs`, `-m tests.redteam_server`) finds it here, whatever its cwd."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH", "")) if p)
    return env


# What coverage's subprocess patch (pyproject.toml's [tool.coverage.run]) sets for the children of a
# measured process: with either, a child of this venv's python starts coverage (its .pth file).
COVERAGE_CHILD_VARIABLES = ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")


def uncovered_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) without coverage's subprocess patch, for a child that runs none
    of the measured code (pip building a wheel, downloading the lock's wheels): under `make test`,
    coverage in pip and its build subprocesses measured nothing and cost about a fifth of the wheel test's CPU (10.5 s -> 8.2 s)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k not in COVERAGE_CHILD_VARIABLES}


# `python -m sprite_os serve` (what __main__ runs), then which of the server's modules and the agent
# SDK's it had imported: a start refused before the server's import (commands/main.py) lists none.
_SERVE_THEN_LIST = ("import sys\nfrom sprite_os.commands.main import main\ncode = main(['serve'])\n"
                    "print(sorted(m for m in sys.modules if m.startswith(('sprite_os.server', 'claude_agent_sdk'))))\n"
                    "raise SystemExit(code)")


def refused_serve(env: Mapping[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`sprite-os serve` that the test expects refused: its stdout is the list above."""
    return subprocess.run([sys.executable, "-c", _SERVE_THEN_LIST], env=dict(env), capture_output=True, text=True,
                          timeout=timeout, check=False)


class ServerDied(SpriteOSError):
    """The server process exited, or never answered /healthz, while it was being started."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    return procfs.alive(pid)


def is_cli(pid: int) -> bool:
    """`pid` runs a Claude Code CLI: the SDK's bundled one, or user isolation's copy of it (by its
    program, not its arguments: the launcher's commands name the CLI too)."""
    program = procfs.cmdline(pid).split(b"\0", 1)[0]
    return program.endswith(b"/claude")


def child_cli_processes(parent: int | None = None) -> list[int]:
    """Claude Code CLI processes whose parent is `parent` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    return [pid for pid in procfs.pids() if (found := procfs.stat(pid)) is not None and found.ppid == parent
            and found.alive and is_cli(pid)]


def workspace_clis(workspace: Path) -> list[int]:
    """Claude Code CLI processes running in `workspace`, whoever their parent (other workspaces'
    CLIs on the same machine are not counted)."""
    found = []
    for pid in procfs.pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == str(workspace) and is_cli(pid) and procfs.alive(pid):
            found.append(pid)
    return found


@dataclass(frozen=True)
class Memory:
    """A process's resident memory (not its children's), in KiB: all 0 if it is gone.

    `anon` is its own memory (the C heap, malloc arenas, Python's objects): what a leak grows.
    `file` is pages of files it maps: the embedding model's weights above all (68 MiB, mapped
    once by each of the two model instances), faulted in as text with new tokens reaches rows
    of the embedding table not read before, and the recall index's vectors (the memory's own
    data). Clean pages of the page cache, never more than the mapped files' size, and the
    kernel's to take back under pressure."""

    rss: int
    anon: int
    file: int


_STATUS_FIELDS = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}


def memory_kib(pid: int) -> Memory:
    values = dict.fromkeys(_STATUS_FIELDS.values(), 0)
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition("\t")
            if name in _STATUS_FIELDS:
                values[_STATUS_FIELDS[name]] = int(rest.split()[0])
    except OSError:
        pass
    return Memory(**values)


def rss_kib(pid: int) -> int:
    """Resident memory of one process (not its children), in KiB; 0 if it is gone."""
    return memory_kib(pid).rss


class ServerProcess:
    """`python -m sprite_os serve` as a child process, for tests that signal or kill it (or another
    `module` that serves the same way).

    `new_session`: the server leads a process group of its own (as `sprite-os service` starts
    it), so the group can be killed without killing the caller. Isolation is `none` unless `env`
    says otherwise: a scratch workspace usually sits where the agent's user can't reach."""

    def __init__(self, workspace: Path, base_url: str, *, module: str = "sprite_os", new_session: bool = False,
                 **env: str) -> None:
        self.workspace = workspace
        self.args = ("-m", module) if module != "sprite_os" else ("-m", module, "serve")
        self.port = free_port()
        self.new_session = new_session
        self.env = {**(kit_env() if module != "sprite_os" else os.environ), "SPRITE_WORKSPACE": str(workspace), "SPRITE_OS_PORT": str(self.port),
                    "SPRITE_OS_TOKEN": TOKEN, "ANTHROPIC_BASE_URL": base_url, "SPRITE_LOG_FORMAT": "json",
                    "SPRITE_ISOLATION": "none", "SPRITE_AGENT_REQUESTS_PER_MINUTE": str(TEST_RATE), **env}
        self.log = workspace.parent / f"server-{self.port}.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def spawn(self) -> ServerProcess:
        """Start the process; do not wait for it to serve."""
        self.workspace.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, *self.args, env=self.env, stdout=log, stderr=log,
                start_new_session=self.new_session)
        return self

    async def healthy(self, timeout: float = 60.0) -> ServerProcess:
        """Wait until /healthz answers."""
        assert self.proc is not None
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self.proc.returncode is not None:
                raise ServerDied(f"server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{self.port}/healthz", None, 1)
                return self
            except OSError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise ServerDied(f"server did not become healthy within {timeout:g} s") from None
                await asyncio.sleep(0.2)

    async def start(self, timeout: float = 60.0) -> ServerProcess:
        await self.spawn()
        return await self.healthy(timeout)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL to the server's whole process group (needs `new_session`)."""
        assert self.new_session, "the group is the caller's own"
        os.killpg(self.pid, signal.SIGKILL)

    async def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def logged(self, event: str) -> list[dict[str, object]]:
        """The fields of each `event` in the server's log (JSON, written line by line), in order."""
        found = []
        for line in self.log.read_text().splitlines() if self.log.exists() else ():
            with contextlib.suppress(ValueError):
                fields = json.loads(line)
                if isinstance(fields, dict) and fields.get("event") == event:
                    found.append(fields)
        return found

    def stop_seconds(self) -> float | None:
        """How long the last stop took as the server measured it: `server_stopped`'s seconds from the
        signal on its loop's clock (None: no stop ended). Not the time until a test hears of the exit,
        which a loaded machine stretches past any margin (a stop done in 2.8 s, an exit heard after 12)."""
        stopped = self.logged("server_stopped")
        return float(str(stopped[-1]["after_s"])) if stopped else None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await self.wait(60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
