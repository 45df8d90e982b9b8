"""`sprite-os service start|stop|restart|status`: the server as a background process on a Sprite.

- start: spawns `python -m sprite_os serve` detached (its own session), logs to
  `.os/logs/sprite-os.log` (JSON) and `.os/logs/server.out` (anything printed), writes
  `.os/state/server.pid`, and waits for `/healthz` to answer.
- stop: SIGTERM, then SIGKILL to the server's whole process group after STOP_TIMEOUT;
  nothing the server started is left running.
- restart: stop, then start (a bad setting fails before the stop).
- status: the pid and the /healthz JSON, all of it: it presents the token (.os/token; /healthz
  says only `ok` or `degraded` without it). Exit codes follow the LSB convention: 0 running,
  1 dead with a stale pid file, 3 not running, 4 running but /healthz does not answer.

The service remembers the settings it was started with (`.os/state/service.env`, 0600; see
commands/service_env.py) once /healthz has answered; a failed start remembers nothing. A later start or restart
(including the one a deploy does) takes each setting from its own environment when set
there, and from the remembered ones otherwise; a failing start names the remembered ones
it used. A setting set to the empty string counts as unset. SPRITE_OS_TOKEN is never
remembered: start writes it into the token file, which a deploy's --token-file rotates.

The pid file is trusted only if /proc shows that pid running `sprite_os` for this workspace.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import procfs
from ..config import Settings, load_settings, resolve_token
from ..errors import ConfigError
from ..fsutil import StillHeld, atomic_write, free_bytes, held
from ..paths import Layout
from ..stopping import (
    LEAVES_THE_DATABASES_SHORT,
    STOP_REPORT,  # the server's account of its stop: which of memory's steps did not finish
    STOP_TIMEOUT,  # the server stops, and exits, within it
    UNFINISHED_SAID,
)
from .service_env import ServiceEnv
from .stop_account import (
    LoggedStop,
    account_steps,
    log_marks,
    read_logged_stop,
    report_id,
)

START_TIMEOUT = 30.0  # the server imports for ~5 s on a 2-core machine; leave room on a smaller Sprite
# How long a start waits for another start to finish: longer than one takes (START_TIMEOUT, then a stop).
START_LOCK_WAIT = START_TIMEOUT + STOP_TIMEOUT + 15.0
LOG_LINES = 15
SERVER_OUT_MAX = 10 * 1024 * 1024

EXIT_OK, EXIT_FAILED, EXIT_DEAD, EXIT_STOPPED, EXIT_UNKNOWN = 0, 1, 1, 3, 4
EXIT_UNFINISHED = 5  # stopped, but the databases lack what the next start adds (spilled turns), or the server
# was killed, or whether they do is not known (no account of the stop, and none in its log)
LACKS = "the databases may lack its last turns until the next start completes them"


# Each line printed at once (a reader that goes away, `service status | head -1`, is no error: the command line's
# output_may_fail sends the rest to /dev/null).
def say(line: str) -> None:
    print(f"sprite-os: {line}", flush=True)


def fail(line: str) -> None:
    print(f"sprite-os: error: {line}", file=sys.stderr, flush=True)


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def service_main(settings: Settings, action: str) -> int:
    """Entry point of `sprite-os service <action>`."""
    service = Service(settings)
    match action:
        case "start":
            return service.start()
        case "stop":
            return service.stop()
        case "restart":
            # A bad setting, or a bad token file, fails before the running server is stopped.
            resolve_token(service.child_settings(), create=True)
            code = service.stop()  # an unfinished stop is said, and the next start does the rest: start it
            return code if code not in (EXIT_OK, EXIT_UNFINISHED) else service.start()
        case "status":
            return service.status()
    fail(f"unknown action {action!r}")
    return 2


# ---------------------------------------------------------------- processes


def alive(pid: int) -> bool:
    return procfs.alive(pid)


def session_members(sid: int) -> list[int]:
    """Live processes in session `sid` (the server and anything it started)."""
    return [pid for pid in procfs.pids() if (found := procfs.stat(pid)) is not None and found.sid == sid
            and found.alive]


@dataclass(frozen=True)
class PidState:
    pid: int | None
    running: bool

    @property
    def stale(self) -> bool:
        return self.pid is not None and not self.running


# /healthz's whole body, read at most: the server's is a few KiB; more is not its answer.
HEALTH_MAX_BYTES = 1 << 20


def _cut_off(conn: http.client.HTTPConnection) -> None:
    """End a /healthz ask at its deadline: the read under way returns, finding the socket shut."""
    with contextlib.suppress(OSError, AttributeError):  # closed meanwhile (its sock None), or never connected
        conn.sock.shutdown(socket.SHUT_RDWR)


class Service:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.layout: Layout = settings.layout
        self.server_out = self.layout.logs_dir / "server.out"
        self.env = ServiceEnv(settings, log_file=self.layout.logs_dir / "sprite-os.log")

    # -- the pid file

    def read_pid(self) -> PidState:
        try:
            pid = int(self.layout.pid_file.read_text().split()[0])
        except FileNotFoundError:
            return PidState(None, False)
        except (OSError, ValueError, IndexError):
            return PidState(-1, False)  # unreadable or garbage: stale
        return PidState(pid, self._is_ours(pid))

    def _is_ours(self, pid: int) -> bool:
        """`pid` is a live sprite_os server of this workspace (not a reused pid)."""
        if pid <= 0 or not alive(pid):
            return False
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        if b"sprite_os" not in args:
            return False
        workspace = (procfs.environ(pid) or {}).get("SPRITE_WORKSPACE")
        if workspace is None:
            return True  # cannot tell which workspace; the command line is ours
        return os.path.realpath(workspace) == os.path.realpath(self.layout.root)

    def _pid_file_lock(self) -> contextlib.AbstractContextManager[None]:
        """Held to write the pid file, and to check and remove it: no start writes between the two."""
        return held(self.layout.pid_lock)

    def _write_pid_file(self, pid: int) -> None:
        with self._pid_file_lock():
            atomic_write(self.layout.pid_file, f"{pid}\n".encode(), mode=0o644)

    def _remove_pid_file(self, pid: int | None = None) -> None:
        """`pid`: only while the file still names it (another command's start may have written its own
        server's since: a stop waiting for the old one must not orphan the new)."""
        try:
            with self._pid_file_lock():
                if pid is None or self.read_pid().pid == pid:
                    self.layout.pid_file.unlink(missing_ok=True)
        except OSError as exc:  # a read-only disk: the server is stopped all the same; the file names a dead pid
            say(f"could not remove the pid file {self.layout.pid_file} ({exc.strerror or exc}): "
                "the next command finds it stale")

    # -- settings for the child (commands/service_env.py)

    def child_env(self, base: Mapping[str, str] | None = None, *, remembered: bool = True) -> dict[str, str]:
        return self.env.child_env(base, remembered=remembered)

    def child_settings(self, env: Mapping[str, str] | None = None) -> Settings:
        return self.env.child_settings(env)

    @staticmethod
    def python() -> str:
        """This venv's interpreter by its real path, so a deploy switching `.os/.venv` does not
        change the libraries under a running server."""
        if sys.prefix != sys.base_prefix:
            real = Path(os.path.realpath(sys.prefix)) / "bin" / Path(sys.executable).name
            if real.exists():
                return str(real)
        return sys.executable

    # -- health

    @staticmethod
    def probe_host(host: str) -> str:
        return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)

    def health(self, settings: Settings, timeout: float = 2.0) -> dict[str, Any] | None:
        """The server's /healthz. With the token (the service runs as the token file's owner, or
        as root), all of it; without, only the status. `timeout` is the whole answer's, not each read's:
        whatever answers on the port (a hung server, another process) held the caller as long as its answer
        went on, a byte at a time or without end. None: no answer in time, or one of over HEALTH_MAX_BYTES."""
        headers = {}
        with contextlib.suppress(ConfigError):
            headers["Authorization"] = f"Bearer {resolve_token(settings, create=False)}"
        deadline = time.monotonic() + timeout
        conn = http.client.HTTPConnection(self.probe_host(settings.host), settings.port, timeout=timeout)
        cut = threading.Timer(timeout, _cut_off, (conn,))
        cut.daemon = True
        try:
            conn.connect()
            cut.interval = max(0.0, deadline - time.monotonic())
            cut.start()  # what is still read when it fires finds the socket shut: no answer
            conn.request("GET", "/healthz", headers=headers)
            response = conn.getresponse()
            body = response.read(HEALTH_MAX_BYTES + 1)
            if response.status != 200 or len(body) > HEALTH_MAX_BYTES:
                return None
            data = json.loads(body)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError, http.client.HTTPException):
            return None
        finally:
            cut.cancel()
            conn.close()

    def _port_taken(self, settings: Settings) -> bool:
        try:
            with socket.create_connection((self.probe_host(settings.host), settings.port), timeout=0.5):
                return True
        except OSError:
            return False

    # -- actions

    def start(self) -> int:
        """One start at a time (`Layout.start_lock`): a second waits, then finds the first's server running.
        Two at once would each spawn a server, and the one that lost the workspace's lock could leave its
        dead pid in the pid file, the live server out of every command's reach. It waits no longer than a
        start takes (START_LOCK_WAIT): a start stopped by Ctrl-Z would hold every later one, a deploy's
        restart too, without a word."""
        if not self.layout.state_dir.is_dir():
            self.layout.ensure()
        lock = self.layout.start_lock
        try:  # a read-only .os/state (or a lock left by root): one line, as a pid file it cannot write is
            os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            fail(f"cannot open the start lock {lock} ({exc.strerror or exc}): no start can run until it can")
            return EXIT_FAILED
        try:
            with held(lock, within=START_LOCK_WAIT):
                return self._start()
        except StillHeld:
            fail(f"another `sprite-os service start` has held {lock} for {START_LOCK_WAIT:.0f}s, longer than a "
                 "start takes: it is stopped (Ctrl-Z) or hung; end it, then start again")
            return EXIT_FAILED

    def _start(self) -> int:
        state = self.read_pid()
        if state.running:
            say(f"already running (pid {state.pid})")
            return EXIT_OK
        if state.stale:
            self._remove_pid_file()
        self.layout.ensure()
        env = self.child_env()
        self.child_settings(env)  # what the server will see; a bad setting fails here, clearly
        if self.env.adopt_token(env):
            say(f"token written to {self.layout.token_file}")
        child = self.child_settings(env)
        resolve_token(child, create=True)  # a bad token file too
        listen, probe = address(child.host, child.port), address(self.probe_host(child.host), child.port)
        if self._port_taken(child):
            probed = f" (probed at {probe})" if probe != listen else ""
            fail(f"port {child.port} on {child.host} is already in use{probed}; stop whatever "
                 "listens there or set SPRITE_OS_PORT")
            self._note_remembered()
            return EXIT_FAILED
        self._rotate_server_out()
        started = time.monotonic()
        with open(self.server_out, "ab") as out:
            out_start = out.tell()  # what this start's server prints comes after this
            proc = subprocess.Popen(
                [self.python(), "-P", "-m", "sprite_os", "serve"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                cwd=self.layout.root, start_new_session=True, close_fds=True,
            )
        try:
            self._write_pid_file(proc.pid)
        except OSError as exc:  # a full or read-only .os/state: a server no command could find or stop
            self._stop_spawned(proc, grace=STOP_TIMEOUT)
            room = ""
            with contextlib.suppress(OSError):
                room = f"; {free_bytes(self.layout.state_dir):,} bytes free on its disk"
            fail(f"cannot write the pid file {self.layout.pid_file} ({exc.strerror or exc}{room}): "
                 "without it no command could find or stop the server, so it was stopped")
            return EXIT_FAILED
        deadline = started + START_TIMEOUT
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                self._remove_pid_file(proc.pid)
                reason = self._server_error(out_start)
                why = (f"{reason} (exited with status {code})" if reason
                       else f"the server exited with status {code} while starting")
                self._report_failure(why, child)
                return EXIT_FAILED
            health = self.health(child, timeout=1.0)
            if health is not None and health.get("pid", proc.pid) == proc.pid:  # not another server on the port
                self.env.remember(env)  # only settings that started a server are worth remembering
                probed = f" (probed at {probe})" if probe != listen else ""
                say(f"started pid {proc.pid}, version {health.get('version')}, status {health.get('status')}, "
                    f"on {listen}{probed} in {time.monotonic() - started:.1f}s; "
                    f"log {child.log_file or self.server_out}")
                return EXIT_OK
            time.sleep(0.1)
        self._stop_spawned(proc, grace=5.0)
        self._remove_pid_file(proc.pid)
        self._report_failure(f"/healthz did not answer within {START_TIMEOUT:.0f}s; stopped it", child)
        return EXIT_FAILED

    def stop(self) -> int:
        state = self.read_pid()
        if state.pid is None:
            say("not running")
            return EXIT_OK
        if state.stale:
            self._remove_pid_file()
            say(f"not running (removed a stale pid file {self.layout.pid_file})")
            return EXIT_OK
        assert state.pid is not None
        started = time.monotonic()
        report = self.layout.state_dir / STOP_REPORT
        with contextlib.suppress(OSError):
            report.unlink(missing_ok=True)  # the server writes this stop's account as it ends
        earlier = report_id(report)  # still there: a read-only disk kept the earlier stop's
        paths, unlocated = self._logs(state.pid)
        logs = log_marks(paths)
        forced = self._terminate(state.pid, grace=STOP_TIMEOUT)
        self._remove_pid_file(state.pid)
        how = f"killed after it did not stop within {STOP_TIMEOUT:g}s" if forced else "stopped"
        say(f"{how} (pid {state.pid}, {time.monotonic() - started:.1f}s)")
        unfinished = account_steps(report, earlier)
        source = "account"
        if unfinished is None:  # no account: a full disk refused it; say what the log says, if anything
            source = "log"
            logged = read_logged_stop(logs)
            unfinished = logged.steps
            if not forced:
                self._say_no_account(logged, unlocated)
        if unfinished:
            said = "; ".join(UNFINISHED_SAID.get(step, step) for step in unfinished)
            say(f"memory's stop did not finish within its share of the stop: {said}")
        short = [step for step in unfinished or [] if step in LEAVES_THE_DATABASES_SHORT]
        if forced and (unfinished is None or short):
            say("exit 5: the server was killed (SIGKILL) before its stop ended, not stopped by it: "
                f"{LACKS}")
        elif forced:
            # Its account may still name put-off work (the curator's last batch): the databases are whole.
            say(f"exit 5: the server was killed (SIGKILL) after its {source} said the databases hold everything "
                "(only its exit hung)")
        elif unfinished is None:
            say("exit 5: the server exited on its own but left no account of its stop: whether memory's stop "
                f"finished is not known, and {LACKS}")
        elif short:
            say(f"exit 5: the server exited on its own, but memory's stop did not finish its steps ({', '.join(short)}): "
                f"{LACKS}")
        else:
            return EXIT_OK
        return EXIT_UNFINISHED

    def _logs(self, pid: int) -> tuple[list[Path], str]:
        """Where the server logs: the log file it was started with (its own environment says, not this
        command's settings, which a restart or another shell may have changed), and its stderr. With
        them, a log file it names that could not be located (relative, and its directory unreadable)."""
        env = procfs.environ(pid)
        log_file: Path | None = None
        if env is not None and env.get("SPRITE_LOG_FILE"):
            log_file = Path(env["SPRITE_LOG_FILE"])
            if not log_file.is_absolute():
                try:
                    log_file = Path(os.readlink(f"/proc/{pid}/cwd")) / log_file
                except OSError:
                    return [self.server_out], str(log_file)
        else:
            with contextlib.suppress(ConfigError):
                log_file = self.child_settings().log_file
        return ([Path(log_file), self.server_out] if log_file is not None else [self.server_out]), ""

    def _say_no_account(self, logged: LoggedStop, unlocated: str = "") -> None:
        """The account (STOP_REPORT) is missing: say why, as far as is known, and where the rest came from."""
        report = self.layout.state_dir / STOP_REPORT
        free = None
        with contextlib.suppress(OSError):
            free = free_bytes(self.layout.state_dir)
        if logged.unwritten:
            why = f"it could not be written: {logged.unwritten}"
        elif logged.ended:  # a whole stop logged, and no refusal: an older release's server writes none
            why = "it was not written: the server predates it, or logged no refusal"
        else:
            why = "it was not written"
        room = f"; {free:,} bytes free on its disk" if free is not None else ""
        source = "what follows is from its log" if logged.steps is not None else "nor does its log say"
        if unlocated and logged.steps is None:
            source = f"its log ({unlocated}, relative to the server's directory) could not be located"
        say(f"the server left no account of its stop in {report} ({why}{room}): {source}")

    def _stop_spawned(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        """The server this start spawned, stopped (`_terminate`) and reaped, so it leaves no zombie."""
        self._terminate(proc.pid, grace=grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)

    def _terminate(self, pid: int, grace: float) -> bool:
        """SIGTERM, wait up to `grace`, then SIGKILL the session. Returns whether it had to kill.
        Whatever else is still in the server's session afterwards is killed too."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        forced = alive(pid)
        for _ in range(50):
            members = session_members(pid)  # the server leads its session (start_new_session)
            if not members:
                break
            for member in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(member, signal.SIGKILL)
            time.sleep(0.02)
        return forced

    def status(self) -> int:
        state = self.read_pid()
        if state.pid is None:
            say("not running")
            return EXIT_STOPPED
        if state.stale:
            which = f"names pid {state.pid}, which is gone" if state.pid > 0 else "is unreadable"
            say(f"not running, but the pid file {self.layout.pid_file} {which}")
            return EXIT_DEAD
        child = load_settings(self.child_env())
        health = self.health(child)
        if health is None:
            say(f"running (pid {state.pid}) but /healthz on {self.probe_host(child.host)}:{child.port} "
                "does not answer")
            return EXIT_UNKNOWN
        say(f"running (pid {state.pid}), status {health.get('status')}, version {health.get('version')}")
        print(json.dumps(health, indent=2), flush=True)
        return EXIT_OK

    # -- logs

    def _rotate_server_out(self) -> None:
        with contextlib.suppress(OSError):
            if self.server_out.stat().st_size > SERVER_OUT_MAX:
                os.replace(self.server_out, self.server_out.with_name(self.server_out.name + ".1"))

    def _server_error(self, offset: int) -> str:
        """The last `sprite-os: error: ...` (or `error: ...`) line the server printed in this start; else
        the exception that ended the last traceback it printed (`ModuleNotFoundError: No module named ...`:
        a release that lost a module), which is the reason, not the log lines printed around it."""
        try:
            with open(self.server_out, "rb") as f:
                f.seek(max(offset, f.seek(0, os.SEEK_END) - 64 * 1024))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            for prefix in ("sprite-os: error:", "error:"):
                if line.startswith(prefix) and line[len(prefix):].strip():
                    return line[len(prefix):].strip()
        raised, in_traceback = "", False
        for line in lines:
            if line.startswith("Traceback (most recent call last):"):
                in_traceback = True
            elif in_traceback and line.strip() and not line[0].isspace():
                raised, in_traceback = line.strip(), False  # the traceback's last line: what was raised
        return raised

    def _note_remembered(self) -> None:
        note = self.env.remembered_note()
        if note:
            print(f"sprite-os: {note}", file=sys.stderr, flush=True)

    def _report_failure(self, why: str, child: Settings) -> None:
        fail(f"the server did not start: {why}")
        self._note_remembered()
        for path in (self.server_out, child.log_file):
            if path is None:
                continue
            lines = _tail(Path(path), LOG_LINES)
            if lines:
                print(f"--- last lines of {path}:\n" + "\n".join(lines), file=sys.stderr, flush=True)


def _tail(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return f.read().decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        return []

