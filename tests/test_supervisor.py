"""`sprite-os service start|stop|restart|status` (sprite_os.commands.service), run from this checkout."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit import faults
from devkit.deploy_support import base_env, healthz, processes_in_session
from devkit.processes import free_port
from sprite_os import procfs
from sprite_os.commands import service as svc
from sprite_os.config import load_settings
from sprite_os.errors import ConfigError
from sprite_os.stopping import STOP_REPORT


def run(ws: Path, action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprite_os", "service", action], capture_output=True, text=True,
                          env=env, timeout=90)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return tmp_path / "ws"


@pytest.fixture
def env(ws: Path) -> Iterator[dict[str, str]]:
    env = base_env(SPRITE_WORKSPACE=str(ws), SPRITE_OS_PORT=str(free_port()),
                   ANTHROPIC_BASE_URL="http://127.0.0.1:9", SPRITE_MEMORY_MODEL="claude-remembered")
    yield env
    # A test that failed half-way must not leave its server running.
    if load_settings(env).layout.pid_file.exists():
        run(ws, "stop", env)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a Sprite OS server."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.long  # the service's commands start and restart real servers
def test_start_status_restart_stop(ws: Path, env: dict[str, str]) -> None:
    layout = load_settings(env).layout
    layout.state_dir.mkdir(parents=True)
    layout.pid_file.write_text(f"{dead_pid()}\n")  # left by a crash

    stale = run(ws, "status", env)
    assert stale.returncode == 1 and "names pid" in stale.stdout

    started = run(ws, "start", env)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "sprite-os: started pid" in started.stdout
    assert f"on 127.0.0.1:{env['SPRITE_OS_PORT']} in " in started.stdout and "probed" not in started.stdout
    pid = int(layout.pid_file.read_text())
    assert svc.alive(pid)
    assert oct((layout.state_dir / "service.env").stat().st_mode & 0o777) == "0o600"

    status = run(ws, "status", env)
    assert status.returncode == 0
    assert status.stdout.startswith(f"sprite-os: running (pid {pid}), status ok")
    body = json.loads(status.stdout.split("\n", 1)[1])
    assert body["status"] == "ok" and "uptime_s" in body and "memory" in body
    # `service status | head -1`: a reader that went away is no error, and no traceback.
    for action in ("status", "start"):
        read, write = os.pipe()
        os.close(read)
        closed = subprocess.run([sys.executable, "-m", "sprite_os", "service", action], stdout=write,
                                stderr=subprocess.PIPE, text=True, env=env, timeout=90)
        os.close(write)
        assert (closed.returncode, closed.stderr) == (0, ""), closed.stderr

    again = run(ws, "start", env)
    assert again.returncode == 0 and f"already running (pid {pid})" in again.stdout

    # Restart from an environment without the settings: the remembered ones are used.
    bare = base_env(SPRITE_WORKSPACE=str(ws))
    restarted = run(ws, "restart", bare)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    new_pid = int(layout.pid_file.read_text())
    assert new_pid != pid and not svc.alive(pid) and processes_in_session(pid) == []
    assert healthz(int(env["SPRITE_OS_PORT"])) == {"status": "ok"}  # without the token, only the status
    assert "uptime_s" in (healthz(int(env["SPRITE_OS_PORT"]), ws) or {})
    log = (layout.logs_dir / "sprite-os.log").read_text().splitlines()
    last_start = [json.loads(line) for line in log if '"server_started"' in line][-1]
    assert last_start["settings"]["memory_model"] == "claude-remembered"
    assert last_start["settings"]["port"] == int(env["SPRITE_OS_PORT"])

    stopped = run(ws, "stop", bare)
    assert stopped.returncode == 0 and f"stopped (pid {new_pid}" in stopped.stdout
    assert not layout.pid_file.exists()
    assert processes_in_session(new_pid) == []
    assert run(ws, "status", bare).returncode == 3
    assert run(ws, "stop", bare).stdout == "sprite-os: not running\n"


def test_a_pid_file_naming_another_process_is_stale(ws: Path, env: dict[str, str],
                                                   bystander: subprocess.Popen[bytes]) -> None:
    layout = load_settings(env).layout
    layout.state_dir.mkdir(parents=True)
    layout.pid_file.write_text(f"{bystander.pid}\n")  # the pid was reused by an unrelated process
    assert run(ws, "status", env).returncode == 1
    stopped = run(ws, "stop", env)
    assert stopped.returncode == 0 and "removed a stale pid file" in stopped.stdout
    assert bystander.poll() is None, "an unrelated process must never be signalled"
    assert not layout.pid_file.exists()
    layout.pid_file.write_text("garbage\n")
    assert "is unreadable" in run(ws, "status", env).stdout


def test_stop_kills_what_ignores_sigterm(ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A server that ignores SIGTERM is killed after the timeout, with everything it started."""
    settings = load_settings(env)
    settings.layout.ensure()
    code = ("import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen(['sleep', '60']); print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, "sprite_os", "serve"], env=env, start_new_session=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout and proc.stdout.readline() == b"up\n"
    settings.layout.pid_file.write_text(f"{proc.pid}\n")
    monkeypatch.setattr(svc, "STOP_TIMEOUT", 0.5)
    assert svc.service_main(settings, "stop") == svc.EXIT_UNFINISHED  # memory's flush, if any, was cut
    out = capsys.readouterr().out
    assert "killed after it did not stop within 0.5s" in out
    # Why it exits 5, in words: the kill, not memory's steps (it wrote no account: it never stopped).
    assert "exit 5: the server was killed (SIGKILL) before its stop ended" in out, out
    assert "memory's stop did not finish" not in out and "exited on its own" not in out
    proc.wait(timeout=5)
    assert proc.returncode == -signal.SIGKILL
    assert processes_in_session(proc.pid) == []  # its child too
    assert not settings.layout.pid_file.exists()


def stop_fake_server(env: dict[str, str], argv: list[str]) -> int:
    """Start `argv` (a stand-in for the server: it prints "up" once its SIGTERM handler is set) as the
    service's server, and stop it with `service stop`: its exit code."""
    settings = load_settings(env)
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout and proc.stdout.readline() == b"up\n"
        settings.layout.pid_file.write_text(f"{proc.pid}\n")
        return svc.service_main(settings, "stop")
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_stop_says_when_memorys_stop_did_not_finish_and_exits_non_zero_when_the_databases_lack_turns(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A server whose memory flush was cut short by its share of the stop ended like any other:
    `service stop` said "stopped" and exited 0, and an operator's script could not tell."""
    settings = load_settings(env)
    settings.layout.ensure()
    report = settings.layout.state_dir / STOP_REPORT
    report.write_text('{"unfinished": ["flush"]}')  # an earlier stop's account is not this one's
    code = ("import json, signal, sys, time\n"
            "def stop(*_):\n"
            f"    open({str(report)!r}, 'w').write(json.dumps({{'unfinished': sys.argv[3:]}}))\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop); print('up', flush=True); time.sleep(60)")
    # Curation put off (the proxy down, the day's budget spent) is said, but is no failure of the stop:
    # every stop in such an hour would exit non-zero and a `stop && backup && start` would stay down.
    for steps, expected in (([], svc.EXIT_OK), (["flush", "imports"], svc.EXIT_OK),
                            (["capture", "flush"], svc.EXIT_UNFINISHED)):
        assert stop_fake_server(env, [sys.executable, "-c", code, "sprite_os", "serve", *steps]) == expected
        out = capsys.readouterr().out
        assert ("memory's stop did not finish" in out) is bool(steps), out
        assert ("exit 5" in out) is (expected == svc.EXIT_UNFINISHED) and "killed" not in out, out
    assert "the last turns' writes (kept in the spill file" in out and "the curator's last batch" in out
    # Why it exits 5, in words: memory's steps, not a kill.
    assert "exit 5: the server exited on its own, but memory's stop did not finish its steps (capture)" in out, out


@pytest.mark.parametrize("steps", [[], ["flush"]])
def test_stop_of_a_server_killed_after_its_account_says_only_its_exit_hung(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        steps: list[str]) -> None:
    """A server that wrote its account (the databases whole) and then hung in its exit is killed: exit 5,
    said as the exit's hang, not as a stop cut short. Its account may name put-off work (the curator's
    last batch): then it is not said to have finished memory's stop."""
    settings = load_settings(env)
    settings.layout.ensure()
    report = settings.layout.state_dir / STOP_REPORT
    code = ("import json, signal, sys, time\n"
            "def stop(*_):\n"
            f"    open({str(report)!r}, 'w').write(json.dumps({{'unfinished': sys.argv[3:]}}))\n"
            "    time.sleep(60)\n"
            "signal.signal(signal.SIGTERM, stop); print('up', flush=True); time.sleep(60)")
    monkeypatch.setattr(svc, "STOP_TIMEOUT", 0.5)
    assert stop_fake_server(env, [sys.executable, "-c", code, "sprite_os", "serve", *steps]) == svc.EXIT_UNFINISHED
    out = capsys.readouterr().out
    assert "exit 5: the server was killed (SIGKILL) after its account said the databases hold everything" in out, out
    assert "only its exit hung" in out and "before its stop ended" not in out, out
    assert ("memory's stop did not finish within its share" in out) is bool(steps), out
    assert "had finished" not in out, out


def test_a_stop_leaves_the_pid_file_a_start_wrote_while_it_waited(
        ws: Path, env: dict[str, str], bystander: subprocess.Popen[bytes]) -> None:
    """Two stops at once, one of them a restart's: the restart's start wrote its new server's pid
    file while the other stop still waited for the old server, which then removed it. The new
    server ran on with no pid file: `status` said not running, and the next start found its port
    taken, with nothing left to stop it by."""
    settings = load_settings(env)
    settings.layout.ensure()
    pid_file = settings.layout.pid_file
    code = stopping_server(f"    open({str(pid_file)!r}, 'w').write('{bystander.pid}\\n')\n")  # another's start
    stop_fake_server(env, [sys.executable, "-c", code, "sprite_os", "serve"])
    assert pid_file.exists() and pid_file.read_text() == f"{bystander.pid}\n"
    pid_file.unlink()


def stopping_server(on_stop: str) -> str:
    """A stand-in server whose SIGTERM runs `on_stop` (Python lines, indented by four) and exits 0."""
    return ("import json, os, signal, sys, time\ndef stop(*_):\n" + on_stop + "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop); print('up', flush=True); time.sleep(60)")


def logging_server(log: Path, lines: list[dict[str, object]]) -> str:
    """A server whose stop can't write its account (a full disk: it writes none) and logs `lines`."""
    return stopping_server(f"    with open({str(log)!r}, 'a') as f:\n"
                           f"        f.writelines(json.dumps(line) + '\\n' for line in {lines!r})\n")


@pytest.mark.parametrize(("logged", "expected", "said"), [
    # What the server logged of this stop, its account unwritten: the log tells what the account would have.
    ([{"event": "server_stopping"},
      {"event": "server_stopped_with_memory_unfinished", "steps": ["capture"]},
      {"event": "stop_report_unwritten", "error": "OSError(28, 'No space left on device')"},
      {"event": "server_stopped"}],
     svc.EXIT_UNFINISHED, ["(it could not be written: OSError(28, 'No space left on device');",
                           "what follows is from its log",
                           "memory's stop did not finish within its share of the stop: the last turns' writes",
                           "exit 5: the server exited on its own, but memory's stop did not finish its steps (capture)"]),
    # A server that predates the account (a deploy's restart stops the old release's): its stop ended, and
    # it logged no refusal, so no disk is blamed.
    ([{"event": "server_stopping"}, {"event": "server_stopped"}],
     svc.EXIT_OK, ["(it was not written: the server predates it, or logged no refusal;",
                   "what follows is from its log"]),
    # Its stop began and never ended (the exit guard ended it): memory's stop as a whole did not finish.
    ([{"event": "server_stopping"}], svc.EXIT_UNFINISHED, ["memory's stop as a whole"]),
    # The log could not be written either: nothing is known, and it is said so, not "stopped" and exit 0.
    ([], svc.EXIT_UNFINISHED, ["(it was not written;", "nor does its log say",
                               "exit 5: the server exited on its own but left no account of its stop"]),
])
def test_stop_without_the_servers_account_says_what_its_log_says_or_that_nothing_is_known(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str], logged: list[dict[str, object]],
        expected: int, said: list[str]) -> None:
    """A full disk refused the stop's account: `service stop` read no account as a clean stop, said
    "stopped" and exited 0, though memory's stop may have left the last turns in the spill file."""
    settings = load_settings(env)
    settings.layout.ensure()
    log = settings.layout.logs_dir / "sprite-os.log"  # the service's log (commands/service_env.py)
    log.write_text(json.dumps({"event": "server_stopped_with_memory_unfinished", "steps": ["stores"]}) + "\n")
    assert stop_fake_server(env, [sys.executable, "-c", logging_server(log, logged), "sprite_os", "serve"]) == expected
    out = capsys.readouterr().out
    assert "the server left no account of its stop" in out and " bytes free on its disk" in out, out
    for words in said:
        assert words in out, out
    assert "closing the recall index" not in out  # an earlier stop's lines in the log are not this one's


def test_stop_of_a_server_killed_after_its_log_says_only_its_exit_hung(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No account (a full disk refused it), the log says the stop ended whole, then the exit hung and was
    killed: what is said of the databases comes from the log, and is said to."""
    settings = load_settings(env)
    settings.layout.ensure()
    log = settings.layout.logs_dir / "sprite-os.log"
    lines = [{"event": "server_stopping"}, {"event": "server_stopped"}]
    code = stopping_server(f"    with open({str(log)!r}, 'a') as f:\n"
                           f"        f.writelines(json.dumps(line) + '\\n' for line in {lines!r})\n"
                           "    time.sleep(60)\n")
    monkeypatch.setattr(svc, "STOP_TIMEOUT", 0.5)
    assert stop_fake_server(env, [sys.executable, "-c", code, "sprite_os", "serve"]) == svc.EXIT_UNFINISHED
    out = capsys.readouterr().out
    assert "exit 5: the server was killed (SIGKILL) after its log said the databases hold everything" in out, out
    assert "its account said" not in out, out


def test_stop_without_its_account_reads_the_log_the_server_rotated_during_its_stop(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """The server's log rotates at its size (logs.py: RotatingFileHandler renames it to `.1`): a stop
    whose first lines went to the file then renamed read only the new one, found `server_stopped`
    alone and exited 0, though the renamed part said memory's stop left the last turns unwritten."""
    settings = load_settings(env)
    settings.layout.ensure()
    log = settings.layout.logs_dir / "sprite-os.log"
    log.write_text(json.dumps({"event": "turn_complete", "note": "x" * 400}) + "\n")  # before the stop
    before = [{"event": "server_stopping"}, {"event": "server_stopped_with_memory_unfinished", "steps": ["capture"]}]
    code = stopping_server(f"    with open({str(log)!r}, 'a') as f:\n"
                           f"        f.writelines(json.dumps(line) + '\\n' for line in {before!r})\n"
                           f"    os.rename({str(log)!r}, {str(log) + '.1'!r})\n"
                           f"    with open({str(log)!r}, 'a') as f:\n"
                           "        f.write(json.dumps({'event': 'server_stopped'}) + '\\n')\n")
    assert stop_fake_server(env, [sys.executable, "-c", code, "sprite_os", "serve"]) == svc.EXIT_UNFINISHED
    out = capsys.readouterr().out
    assert "exit 5: the server exited on its own, but memory's stop did not finish its steps (capture)" in out, out


def test_stop_without_its_account_reads_all_the_server_logged_during_its_stop(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A stop in a storm of errors: more than 4 MB logged between `server_stopping` and
    `server_stopped` (a log rotates at 10 MB). Only the first 4 MB were read: the stop seemed
    never to end, and a whole stop exited 5, memory's stop as a whole said unfinished."""
    settings = load_settings(env)
    settings.layout.ensure()
    log = settings.layout.logs_dir / "sprite-os.log"
    storm = json.dumps({"event": "connection_failed", "error": "e" * 400})
    code = stopping_server(f"    with open({str(log)!r}, 'a') as f:\n"
                           "        f.write(json.dumps({'event': 'server_stopping'}) + '\\n')\n"
                           f"        f.write({storm + chr(10)!r} * 12_000)\n"  # about 5 MB
                           "        f.write(json.dumps({'event': 'server_stopped'}) + '\\n')\n")
    assert stop_fake_server(env, [sys.executable, "-c", code, "sprite_os", "serve"]) == svc.EXIT_OK
    out = capsys.readouterr().out
    assert "what follows is from its log" in out and "exit 5" not in out, out


def test_stop_without_its_account_reads_the_log_the_server_writes_not_the_one_its_settings_name_now(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A server started with SPRITE_LOG_FILE elsewhere, stopped from a shell (or a restart) whose
    settings name another log: the stop read that other log, found nothing of the stop, and said
    nothing was known, though the server's own log said its stop ended whole."""
    settings = load_settings(env)
    settings.layout.ensure()
    elsewhere = ws.parent / "elsewhere.log"
    logged = [{"event": "server_stopping"}, {"event": "server_stopped"}]
    server_env = {**env, "SPRITE_LOG_FILE": str(elsewhere)}
    assert "SPRITE_LOG_FILE" not in os.environ  # the stop's own settings name the service's default log
    assert stop_fake_server(server_env, [sys.executable, "-c", logging_server(elsewhere, logged),
                                         "sprite_os", "serve"]) == svc.EXIT_OK
    out = capsys.readouterr().out
    assert "what follows is from its log" in out, out


def test_stop_on_a_read_only_state_dir_takes_no_earlier_stops_account_for_its_own(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """.os/state remounted read-only (a failing disk's errors=remount-ro): the earlier stop's account
    could not be removed and this server could not write its own, so the stop read the earlier one
    as this stop's (there: nothing short, exit 0), though this server logged that the last turns'
    writes did not finish."""
    settings = load_settings(env)
    layout = settings.layout
    layout.ensure()
    log = layout.logs_dir / "sprite-os.log"
    logged = [{"event": "server_stopping"},
              {"event": "server_stopped_with_memory_unfinished", "steps": ["capture"]},
              {"event": "stop_report_unwritten", "error": "OSError(30, 'Read-only file system')"},
              {"event": "server_stopped"}]
    proc = subprocess.Popen([sys.executable, "-c", logging_server(log, logged), "sprite_os", "serve"],
                            env=env, start_new_session=True, stdout=subprocess.PIPE)
    try:
        with faults.small_tmpfs(layout.state_dir, "1m") as state:
            assert proc.stdout and proc.stdout.readline() == b"up\n"
            layout.pid_file.write_text(f"{proc.pid}\n")
            (state / STOP_REPORT).write_text('{"unfinished": []}')  # the earlier stop's, all finished
            if subprocess.run(["mount", "-o", "remount,ro", str(state)], capture_output=True).returncode != 0:
                pytest.skip("cannot remount a tmpfs read-only here")
            try:
                code = svc.service_main(settings, "stop")
            finally:
                subprocess.run(["mount", "-o", "remount,rw", str(state)], check=False)
    except faults.FaultSetupFailed as exc:
        pytest.skip(str(exc))
    finally:
        proc.kill()
        proc.wait(timeout=5)
    out = capsys.readouterr().out
    assert code == svc.EXIT_UNFINISHED, out
    assert "Read-only file system" in out and "(capture)" in out, out


@pytest.mark.long  # a real server, started and stopped by the service
def test_stop_on_a_full_disk_says_what_the_servers_log_says_of_its_stop(ws: Path, env: dict[str, str]) -> None:
    """.os/state on a tiny file system, full by the stop: the server's account of its stop can't be
    written, and `service stop` tells the operator so, and what the server's log says of the stop."""
    layout = load_settings(env).layout
    try:
        with faults.small_tmpfs(layout.state_dir, "1m") as state:
            try:
                started = run(ws, "start", env)
                assert started.returncode == 0, started.stdout + started.stderr
                filler = faults.fill(state)
                stopped = run(ws, "stop", env)
            finally:
                if layout.pid_file.exists():
                    (state / "filler").unlink(missing_ok=True)
                    run(ws, "stop", env)
            filler.unlink()
    except faults.FaultSetupFailed as exc:
        pytest.skip(str(exc))
    out = stopped.stdout
    assert "the server left no account of its stop" in out and "No space left on device" in out, out
    assert "what follows is from its log" in out, out
    assert stopped.returncode == svc.EXIT_OK, out  # the log says memory's stop finished: the databases are whole


def test_start_failure_reports_the_log(ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(env)
    fake = ws.parent / "crashing-python"
    fake.write_text("#!/bin/sh\necho 'Traceback: the server could not bind' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(svc.Service, "python", staticmethod(lambda: str(fake)))
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    assert svc.service_main(settings, "start") == 1
    err = capsys.readouterr().err
    assert "the server exited with status 3 while starting" in err
    assert "Traceback: the server could not bind" in err
    assert not settings.layout.pid_file.exists()


def test_a_start_that_cannot_write_its_pid_file_stops_the_server_it_started(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A full (or read-only) .os/state refuses the pid file: the start ended in a traceback, and the
    server it had spawned ran on where `service status` said `not running` and `service stop` could
    not reach it."""
    settings = load_settings(env)
    started: list[int] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(["sleep", "300"], **{k: v for k, v in kwargs.items() if k != "env"})
        started.append(proc.pid)
        return proc

    def no_room(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(svc.subprocess, "Popen", popen)
    monkeypatch.setattr(svc, "atomic_write", no_room)
    monkeypatch.setattr(os, "environ", {**base_env(), **env})
    try:
        code = svc.service_main(settings, "start")
    finally:
        leaked = [pid for pid in started if svc.alive(pid)]
        for pid in leaked:  # what the test made, whatever the command did
            os.kill(pid, signal.SIGKILL)
    assert code == 1 and leaked == [], "the server it spawned was left running"
    err = capsys.readouterr().err
    assert f"cannot write the pid file {settings.layout.pid_file} (No space left on device;" in err, err
    assert "so it was stopped" in err and len(started) == 1


# A stand-in server: answers /healthz with its pid on SPRITE_OS_PORT; the port taken, it exits as a
# server that lost the workspace to another does (status 2, its error line).
STAND_IN_SERVER = """
import http.server, json, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok", "version": "stand-in", "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *_):
        pass
try:
    server = http.server.HTTPServer(("127.0.0.1", int(os.environ["SPRITE_OS_PORT"])), Health)
except OSError:
    print("sprite-os: error: another server holds this workspace", file=sys.stderr, flush=True)
    sys.exit(2)
server.serve_forever()
"""


def test_two_starts_at_once_start_one_server_and_both_say_so(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Both starts read `not running` before either wrote its pid file: each spawned a server, the
    loser died, and its start took the winner's /healthz for its own (`started pid <dead>`, exit 0),
    or removed the winner's pid file as it reported its own failure."""
    settings = load_settings(env)
    stand_in = ws.parent / "stand-in.py"
    stand_in.write_text(STAND_IN_SERVER)
    server = fake_server(ws.parent / "server", f'exec {sys.executable} {stand_in} "$@"')  # its argv names sprite_os
    monkeypatch.setattr(svc.Service, "python", staticmethod(lambda: server))
    monkeypatch.setattr(os, "environ", {**base_env(), **env})
    both_read = threading.Barrier(2)
    real_read = svc.Service.read_pid

    def read_pid(self: svc.Service) -> svc.PidState:
        state = real_read(self)
        with contextlib.suppress(threading.BrokenBarrierError):  # one start at a time: the other never comes
            both_read.wait(timeout=3)
        return state

    monkeypatch.setattr(svc.Service, "read_pid", read_pid)
    codes: list[int] = []
    starts = [threading.Thread(target=lambda: codes.append(svc.service_main(settings, "start"))) for _ in range(2)]
    try:
        for start in starts:
            start.start()
        for start in starts:
            start.join(timeout=60)
        out = capsys.readouterr().out
        pid = int(settings.layout.pid_file.read_text())
        assert svc.alive(pid), out
        assert codes == [0, 0] and out.count("sprite-os: started pid") == 1, out
        assert f"started pid {pid}," in out and f"already running (pid {pid})" in out, out
    finally:
        monkeypatch.setattr(svc.Service, "read_pid", real_read)
        svc.service_main(settings, "stop")
        for proc in procfs.pids():  # any stand-in the old code left without a pid file
            if str(stand_in).encode() in (procfs.cmdline(proc) or b""):
                os.kill(proc, signal.SIGKILL)


def test_a_start_held_up_by_a_stopped_start_gives_up_and_says_so(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A start stopped by Ctrl-Z (or hung) holds the start lock: every later start, a deploy's restart
    too, waited for it without a word for as long as it stayed stopped. A start now waits no longer
    than a start takes, then fails naming the lock. A killed start leaves nothing held (a flock)."""
    settings = load_settings(env)
    settings.layout.ensure()
    lock = settings.layout.start_lock
    ran: list[str] = []
    monkeypatch.setattr(svc.Service, "_start", lambda self: ran.append("start") or 0)  # never a server here
    monkeypatch.setattr(svc, "START_LOCK_WAIT", 1.0, raising=False)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(300)"],
                              stdout=subprocess.PIPE, text=True)
    codes: list[int] = []
    start = threading.Thread(target=lambda: codes.append(svc.service_main(settings, "start")), daemon=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        holder.send_signal(signal.SIGSTOP)  # as Ctrl-Z would
        start.start()
        start.join(timeout=10)
        assert not start.is_alive() and codes == [1] and ran == [], "the start waited on the stopped one"
        err = capsys.readouterr().err
        assert f"another `sprite-os service start` has held {lock} for 1s" in err, err
    finally:
        holder.kill()
        holder.wait()
        start.join(timeout=10)
    ran.clear()
    assert svc.service_main(settings, "start") == 0 and ran == ["start"]  # the killed holder left it free


def test_a_start_lock_it_cannot_open_is_one_line(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only .os/state (or a start lock root left, 0600): opening the start lock raised, and the
    start ended in a traceback, where a pid file it could not write was one line before the lock."""
    settings = load_settings(env)
    settings.layout.ensure()
    real_open = os.open

    def read_only(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".start-lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert svc.service_main(settings, "start") == 1
    err = capsys.readouterr().err
    assert err == (f"sprite-os: error: cannot open the start lock {settings.layout.start_lock} "
                   "(Read-only file system): no start can run until it can\n"), err
    assert not settings.layout.pid_file.exists()


def fake_server(path: Path, script: str) -> str:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


def test_a_failed_start_remembers_nothing_and_names_what_it_remembered(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(env)
    layout = settings.layout
    outer = {**base_env(), **env}
    bad_host = fake_server(ws.parent / "bad-host", "echo 'sprite-os: error: cannot listen on not-a-host:1: "
                           "Name or service not known' >&2\nexit 2")
    monkeypatch.setattr(svc.Service, "python", staticmethod(lambda: bad_host))
    monkeypatch.setattr(os, "environ", {**outer, "SPRITE_OS_HOST": "not-a-host"})
    assert svc.service_main(settings, "start") == 1
    err = capsys.readouterr().err.splitlines()
    # The headline is the server's own reason; the tail is still below it.
    assert err[0] == ("sprite-os: error: the server did not start: cannot listen on not-a-host:1: "
                      "Name or service not known (exited with status 2)")
    assert any(line.startswith("--- last lines of") for line in err)
    assert not layout.service_env.exists(), "a failed start must not remember its settings"
    assert not any("remembered" in line for line in err)  # nothing was remembered

    # A setting remembered earlier (by an older version, or a host that no longer resolves) is named.
    layout.service_env.write_text(json.dumps({"SPRITE_OS_HOST": "not-a-host", "SPRITE_MEMORY_MODEL": "m"}))
    monkeypatch.setattr(os, "environ", {**outer})  # sets SPRITE_MEMORY_MODEL: not the remembered one
    assert svc.service_main(settings, "start") == 1
    err = capsys.readouterr().err.splitlines()
    assert err[1] == (f"sprite-os: using remembered SPRITE_OS_HOST from {layout.service_env}; "
                      "set it to the empty string to drop it")
    assert json.loads(layout.service_env.read_text())["SPRITE_OS_HOST"] == "not-a-host"  # unchanged

    # This start's server printed no error line: an earlier start's is not taken for its reason.
    crash = fake_server(ws.parent / "crash", "echo 'Traceback: something else'\nexit 3")
    monkeypatch.setattr(svc.Service, "python", staticmethod(lambda: crash))
    monkeypatch.setattr(os, "environ", {**outer, "SPRITE_OS_HOST": ""})  # drops the remembered one
    assert svc.service_main(settings, "start") == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "sprite-os: error: the server did not start: the server exited with status 3 while starting"
    assert not any("remembered" in line for line in err)


def test_a_start_that_dies_on_a_traceback_names_what_it_raised(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A release that lost a module dies on its import with a traceback and no error line: the
    headline is what it raised, not only its status (a deploy's restart reports that one line)."""
    settings = load_settings(env)
    crash = fake_server(ws.parent / "crash", "cat >&2 <<'EOF'\n{\"event\": \"server_starting\"}\n"
                        "Traceback (most recent call last):\n  File \"main.py\", line 143, in _serve\n"
                        "    from ..server import serve_main\n"
                        "ModuleNotFoundError: No module named 'sprite_os.server'\nEOF\nexit 1")
    monkeypatch.setattr(svc.Service, "python", staticmethod(lambda: crash))
    monkeypatch.setattr(os, "environ", {**base_env(), **env})
    assert svc.service_main(settings, "start") == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("sprite-os: error: the server did not start: ModuleNotFoundError: No module named "
                      "'sprite_os.server' (exited with status 1)"), err


def test_a_bad_host_fails_with_the_reason_and_is_not_remembered(ws: Path, env: dict[str, str]) -> None:
    """The real server, as the operator ran it."""
    failed = run(ws, "start", {**env, "SPRITE_OS_HOST": "not-a-host"})
    assert failed.returncode == 1
    headline = failed.stderr.splitlines()[0]
    assert headline.startswith("sprite-os: error: the server did not start: cannot listen on not-a-host:"), headline
    assert not load_settings(env).layout.service_env.exists()


def test_start_refuses_port_0_at_once(ws: Path, env: dict[str, str]) -> None:
    for action in ("start", "restart"):
        refused = run(ws, action, {**env, "SPRITE_OS_PORT": "0"})
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.startswith("sprite-os: error: SPRITE_OS_PORT=0") and refused.stderr.count("\n") == 1
        assert refused.stdout == ""  # restart: nothing stopped either
    layout = load_settings(env).layout
    # At once: refused before a server was started (whose output goes to server.out) or waited for.
    assert not (layout.logs_dir / "server.out").exists() and not layout.pid_file.exists()


def test_restart_with_a_bad_token_file_fails_before_stopping_anything(ws: Path, env: dict[str, str]) -> None:
    token_file = load_settings(env).layout.token_file
    token_file.parent.mkdir(parents=True)
    token_file.write_text("a-token-that-others-can-read-0123\n")
    token_file.chmod(0o644)
    refused = run(ws, "restart", env)
    assert refused.returncode == 2 and "token" in refused.stderr, refused.stdout + refused.stderr
    assert refused.stdout == ""  # nothing was stopped


def test_a_remembered_bad_setting_is_named_in_the_one_line(ws: Path, env: dict[str, str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(env)
    settings.layout.ensure()
    settings.layout.service_env.write_text(json.dumps({"SPRITE_OS_PORT": "0", "SPRITE_OS_HOST": "::1"}))
    monkeypatch.setattr(os, "environ", {k: v for k, v in {**os.environ, **env}.items() if k != "SPRITE_OS_PORT"})
    with pytest.raises(ConfigError) as info:
        svc.service_main(settings, "start")
    assert str(info.value).endswith(f"(using remembered SPRITE_OS_PORT from {settings.layout.service_env}; "
                                    "set it to the empty string to drop it)")


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_start_refuses_a_port_in_use(ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], host: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        env.update(SPRITE_OS_PORT=str(port), SPRITE_OS_HOST=host)
        monkeypatch.setattr(os, "environ", {**os.environ, **env})
        started = time.monotonic()
        assert svc.service_main(load_settings(env), "start") == 1
        assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    probed = f" (probed at 127.0.0.1:{port})" if host == "0.0.0.0" else ""
    assert f"port {port} on {host} is already in use{probed}; stop" in err
    assert not load_settings(env).layout.pid_file.exists()


def test_child_env(ws: Path, env: dict[str, str]) -> None:
    service = svc.Service(load_settings(env))
    child = service.child_env({"PATH": "/bin", "SPRITE_LOG_FORMAT": "kv", "PYTHONHOME": "/x"})
    assert child["SPRITE_WORKSPACE"] == str(ws)
    assert child["SPRITE_LOG_FORMAT"] == "kv"  # set by the caller: kept
    assert child["SPRITE_LOG_FILE"] == str(ws / ".os" / "logs" / "sprite-os.log")
    assert "PYTHONHOME" not in child
    assert "PYTHONPATH" not in child  # a checkout is not a release: nothing to pin
    assert svc.Service.probe_host("0.0.0.0") == "127.0.0.1"
    assert (svc.address("0.0.0.0", 80), svc.address("::", 80)) == ("0.0.0.0:80", "[::]:80")


def test_token_is_never_remembered_and_the_token_file_wins(ws: Path, env: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """SPRITE_OS_TOKEN goes into .os/token, never into service.env, so rotating the file (a deploy's
    --token-file) is what a later restart serves. The server is a fake that records its environment."""
    dump = ws.parent / "child.env"
    fake = ws.parent / "fake-python"
    fake.write_text(f"#!/bin/sh\nenv > {dump}\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(svc.Service, "python", staticmethod(lambda: str(fake)))
    settings = load_settings(env)
    layout = settings.layout

    def start(**extra: str) -> dict[str, str]:
        monkeypatch.setattr(os, "environ", {**base_env(), **env, **extra})
        assert svc.service_main(settings, "start") == 1  # the fake exits; start has done its part
        return dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)

    child = start(SPRITE_OS_TOKEN="first-token-0123456789")
    assert "SPRITE_OS_TOKEN" not in child  # the server reads the file
    assert layout.token_file.read_text() == "first-token-0123456789\n"
    assert oct(layout.token_file.stat().st_mode & 0o777) == "0o600"
    assert not layout.service_env.exists()  # the start failed: nothing remembered
    remembered = {"SPRITE_MEMORY_MODEL": "claude-remembered"}

    # A service.env written by an older version still names a token; a rotated file wins over it.
    layout.service_env.write_text(json.dumps({**remembered, "SPRITE_OS_TOKEN": "stale-token-0123456789"}))
    layout.token_file.write_text("rotated-token-0123456789\n")
    assert "SPRITE_OS_TOKEN" not in start()
    assert layout.token_file.read_text() == "rotated-token-0123456789\n"
    assert "SPRITE_OS_TOKEN" not in json.loads(layout.service_env.read_text())
    # ... and with no token file at all, it is carried into one rather than lost.
    layout.service_env.write_text(json.dumps({**remembered, "SPRITE_OS_TOKEN": "stale-token-0123456789"}))
    layout.token_file.unlink()
    start()
    assert layout.token_file.read_text() == "stale-token-0123456789\n"


def test_a_stop_removing_its_pid_file_keeps_one_another_start_writes_meanwhile(
        ws: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop checked the file still named its server, then unlinked it: a `service start` from
    another shell writing its own server's pid between the two lost it (its server then unseen)."""
    import threading

    settings = load_settings(env)
    settings.layout.ensure()
    stopping, starting = svc.Service(settings), svc.Service(settings)
    stopping._write_pid_file(dead_pid())
    old = stopping.read_pid().pid
    read, writers = stopping.read_pid, []

    def then_a_start_writes(*_: object) -> svc.PidState:
        state = read()
        writers.append(threading.Thread(target=starting._write_pid_file, args=(424242,)))
        writers[0].start()
        writers[0].join(0.3)  # done at once, unless the stop holds the pid file for its check and unlink
        return state

    monkeypatch.setattr(stopping, "read_pid", then_a_start_writes)
    stopping._remove_pid_file(old)
    writers[0].join(5)
    try:
        assert settings.layout.pid_file.read_text() == "424242\n"
    finally:
        settings.layout.pid_file.unlink(missing_ok=True)


def test_stop_without_its_account_says_when_the_servers_log_could_not_be_located(
        ws: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's SPRITE_LOG_FILE is relative to its own directory: when that could not be read
    (/proc/<pid>/cwd), it was taken relative to the command's, and the operator told "nor does its
    log say" of a file that was never the server's log."""
    settings = load_settings(env)
    settings.layout.ensure()

    def unreadable(path: str) -> str:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(svc.os, "readlink", unreadable)
    server = [sys.executable, "-c", stopping_server("    pass\n"), "sprite_os", "serve"]
    assert stop_fake_server({**env, "SPRITE_LOG_FILE": "server-own.log"}, server) == svc.EXIT_UNFINISHED
    out = capsys.readouterr().out
    assert "its log (server-own.log, relative to the server's directory) could not be located" in out, out
    assert "nor does its log say" not in out, out
