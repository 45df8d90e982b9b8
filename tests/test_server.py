"""The server process's start-up failures: one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

from tests.conftest import TOKEN


async def test_a_port_in_use_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "SPRITE_WORKSPACE": str(workspace), "SPRITE_OS_PORT": str(port),
               "SPRITE_OS_HOST": "127.0.0.1", "SPRITE_OS_TOKEN": TOKEN, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sprite_os", "serve", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == f"sprite-os: error: cannot listen on 127.0.0.1:{port}: Address already in use"


async def test_a_missing_model_proxy_is_warned_about_at_start(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from tests.conftest import make_settings, running

    for base_url, warned in ((None, True), ("http://127.0.0.1:9", False)):
        with capture_logs() as logs:
            async with running(make_settings(tmp_path / f"ws-{warned}", base_url)):  # type: ignore[arg-type]
                pass
        assert any(e["event"] == "model_proxy_unset" and e["log_level"] == "warning" for e in logs) is warned


def test_the_server_starts_without_the_curators_sdk() -> None:
    """The anthropic SDK took more than half of `import sprite_os.server` (seconds, every start);
    the curator, its one user, imports it at its first call."""
    import subprocess

    probe = "import sys, sprite_os.server; print(sorted(m for m in sys.modules if m.split('.')[0] == 'anthropic'))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "[]\n"


def test_the_command_line_imports_no_sdk_until_a_command_needs_one() -> None:
    """Every `sprite-os` run (service start/stop/status, a deploy's steps, version) builds the whole
    parser: building it imported the agent SDK through memory's modules (seconds each time)."""
    import subprocess

    probe = ("import sys; from sprite_os.commands.main import main; main(['version']); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'claude_agent_sdk', 'anthropic', 'mcp', 'numpy'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
