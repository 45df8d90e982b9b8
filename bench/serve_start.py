"""One `sprite-os serve` start to ready and a clean stop (no turn), for timing from outside.

    python bench/serve_start.py [--workspace DIR] [--keep]

Starts `python -m sprite_os serve` (this interpreter: run it with the venv's python; PYTHONPATH
picks the code) on a fresh scratch workspace (or DIR, which then persists, as a restart's would),
waits until /healthz answers, sends SIGTERM, and waits for the exit. Prints the server's own CPU
(user + system, from its rusage) in ms, and its exit status. It imports nothing of Sprite OS and
little else, so that a whole-process timer sees mostly the server's start and stop:

    farm-bench -n 5 --vs 'env PYTHONPATH=BEFORE .venv/bin/python bench/serve_start.py' -- \\
        .venv/bin/python bench/serve_start.py

Isolation is `none` and the model proxy an unused loopback port: no turn is run.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TOKEN = "bench-serve-start-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _reap(pid: int, deadline: float) -> tuple[int, resource.struct_rusage]:
    """Its exit status and rusage, once it exited; SystemExit at the deadline (a stop that hangs is
    killed, below, rather than holding up the bench)."""
    while True:
        reaped, status, usage = os.wait4(pid, os.WNOHANG)
        if reaped:
            return status, usage
        if time.monotonic() > deadline:
            raise SystemExit("the server did not stop after SIGTERM")
        time.sleep(0.02)


def serve_once(workspace: str, log_dir: str, timeout: float = 60.0) -> tuple[float, int]:
    """The server's CPU in seconds (user + system) and its exit status; its log goes into `log_dir`."""
    port = _free_port()
    env = {**os.environ, "SPRITE_WORKSPACE": workspace, "SPRITE_OS_PORT": str(port), "SPRITE_OS_TOKEN": TOKEN,
           "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "SPRITE_ISOLATION": "none", "SPRITE_LOG_FORMAT": "json"}
    with open(os.path.join(log_dir, f"serve-{port}.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sprite_os", "serve"], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + timeout
    try:
        while not _healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not become healthy (exit {proc.returncode})")
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        status, usage = _reap(proc.pid, time.monotonic() + timeout)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    return usage.ru_utime + usage.ru_stime, proc.returncode


def main(argv: list[str]) -> int:
    keep = "--keep" in argv
    chosen = argv[argv.index("--workspace") + 1] if "--workspace" in argv else None
    scratch = tempfile.mkdtemp(prefix="serve-start-")
    try:
        workspace = chosen or os.path.join(scratch, "ws")
        os.makedirs(workspace, exist_ok=True)
        cpu, code = serve_once(workspace, scratch)
        print(f"serve_cpu_ms={cpu * 1000:.0f} exit={code}")
        return code
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
