"""The write guard: Write/Edit into `.os/` and Read of the secrets are denied before they run."""

import os
from pathlib import Path

import pytest

from sprite_os.agent.guard import ToolGuard, through_proc
from sprite_os.paths import Layout


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    layout = Layout(tmp_path)
    layout.ensure()
    (layout.memory_dir / "user.md").write_text("x")
    layout.token_file.write_text("0123456789abcdef0123")
    os.symlink(layout.memory_dir, tmp_path / "documents" / "link")
    return tmp_path


@pytest.fixture
def guard(ws: Path) -> ToolGuard:
    return ToolGuard(Layout(ws))


@pytest.mark.parametrize(("tool", "path", "cwd", "denied"), [
    ("Write", ".os/memory/user.md", ".", True),
    ("Write", "{ws}/.os/memory/user.md", ".", True),
    ("Write", "documents/link/user.md", ".", True),  # a symlink from user space into .os
    ("Write", "../.os/memory/user.md", "documents", True),
    ("Write", "./documents/../.os/token", ".", True),
    ("Edit", "{ws}/.os/memory/new.md", ".", True),
    ("MultiEdit", ".os/src/server.py", ".", True),
    ("NotebookEdit", ".os/x.ipynb", ".", True),
    ("Write", "documents/notes.md", ".", False),
    ("Write", "artifacts/.osx/report.md", ".", False),  # a name that merely starts with .os
    ("Read", ".os/memory/user.md", ".", False),
    ("Read", ".os/token", ".", True),
    ("Read", "{ws}/.os/state/service.env", ".", True),
])
def test_file_tools(guard: ToolGuard, ws: Path, tool: str, path: str, cwd: str, denied: bool) -> None:
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    reason = guard.check(tool, {key: path.format(ws=ws)}, str(ws / cwd))
    assert (reason is not None) == denied
    if denied:
        assert "Memory is saved automatically" in reason or "credentials" in reason


def test_a_hard_link_to_the_token_is_the_token(guard: ToolGuard, ws: Path) -> None:
    os.link(ws / ".os" / "token", ws / "documents" / "innocent.txt")
    assert guard.check("Read", {"file_path": "documents/innocent.txt"}, str(ws)) is not None
    assert guard.check("Read", {"file_path": "documents/missing.txt"}, str(ws)) is None


@pytest.mark.parametrize("command", ["echo hi > .os/memory/user.md", "rm -rf .os", "cat .os/token"])
def test_bash_is_left_to_the_kernel(guard: ToolGuard, ws: Path, command: str) -> None:
    # The kernel (user mode) or bubblewrap (sandbox mode) refuses these; a reader of shell text could
    # be talked around, so there is none (docs/security.md).
    assert guard.check("Bash", {"command": command}, str(ws)) is None


async def test_the_hook_denies_in_the_cli_format(guard: ToolGuard, ws: Path) -> None:
    out = await guard.hook({"tool_name": "Write", "tool_input": {"file_path": ".os/memory/user.md"}, "cwd": str(ws)},
                           None, None)
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert out["hookSpecificOutput"]["hookEventName"] == "PreToolUse"
    assert await guard.hook({"tool_name": "Write", "tool_input": {"file_path": "documents/a"}, "cwd": str(ws)},
                            None, None) == {}
    assert await guard.hook(None, None, None) == {}  # malformed input: no opinion, no exception


async def test_a_call_the_guard_cannot_check_is_denied(guard: ToolGuard, ws: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> str | None:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(guard, "check", broken)
    out = await guard.hook({"tool_name": "Write", "tool_input": {"file_path": "a"}, "cwd": str(ws)}, None, None)
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"  # fails closed: it may have written .os/
    assert "could not check" in out["hookSpecificOutput"]["permissionDecisionReason"]


@pytest.mark.parametrize(("tool", "path"), [
    ("Read", "/proc/self/cwd/.os/token"),  # the server's cwd here, the CLI's workspace there
    ("Write", "/proc/self/cwd/.os/memory/user.md"),
    ("Edit", "/proc/thread-self/cwd/.os/src/sprite_os/server.py"),
    ("Read", "/dev/fd/3"),  # /dev/fd -> /proc/self/fd
    ("Write", "documents/to-proc/memory/user.md"),  # a link made in user space, into /proc
    ("Read", "documents/to-proc/token"),
])
def test_a_path_through_proc_is_denied(guard: ToolGuard, ws: Path, tool: str, path: str) -> None:
    (ws / "documents" / "to-proc").symlink_to("/proc/self/cwd/.os")
    reason = guard.check(tool, {"file_path": path}, str(ws))
    assert reason is not None and "/proc" in reason


@pytest.mark.parametrize("path", ["documents/notes.md", "documents/inner/../notes.md", "documents/inside/x.md",
                                  "/tmp/plain.txt"])
def test_a_path_that_stays_out_of_proc_is_not_denied_for_it(guard: ToolGuard, ws: Path, path: str) -> None:
    (ws / "documents" / "real").mkdir()
    (ws / "documents" / "inside").symlink_to(ws / "documents" / "real")
    assert not through_proc(ws / path)
    assert guard.check("Write", {"file_path": path}, str(ws)) is None


def test_a_symlink_loop_is_denied_not_followed_forever(guard: ToolGuard, ws: Path) -> None:
    (ws / "documents" / "loop").symlink_to(ws / "documents" / "loop")
    assert through_proc(ws / "documents" / "loop" / "x")


def test_the_logs_are_not_for_the_read_tool(guard: ToolGuard, ws: Path) -> None:
    """As in the sandbox's denyRead: the Read tool is not sandboxed, so the guard holds the line."""
    logs = Layout(ws).logs_dir
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "sprite-os.log").write_text("{}\n")
    assert guard.check("Read", {"file_path": ".os/logs/sprite-os.log"}, str(ws)) is not None
    assert guard.check("Read", {"file_path": "documents/../.os/logs/sprite-os.log"}, str(ws)) is not None
    assert guard.check("Read", {"file_path": "documents/notes.md"}, str(ws)) is None


@pytest.mark.parametrize(("path", "denied"), [
    ("/etc/cron.d/x", True),  # sandbox mode: the file tools are not in bubblewrap
    ("/root/.bashrc", True),
    ("/usr/local/lib/python3/sitecustomize.py", True),
    ("/tmp/scratch.txt", False),
    ("documents/notes.md", False),
    ("new-top-level.md", False),
])
def test_the_file_tools_write_only_in_the_workspace_and_the_temp_folder(guard: ToolGuard, ws: Path, path: str,
                                                                       denied: bool) -> None:
    reason = guard.check("Write", {"file_path": path, "content": "x"}, str(ws))
    assert (reason is not None) == denied, reason
    if denied:
        assert reason is not None and "workspace" in reason
