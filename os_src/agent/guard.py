"""The tool guard: a PreToolUse check on the CLI's own file tools (Read, Write, Edit...).

Write, Edit, MultiEdit and NotebookEdit on a path that resolves (relative to the tool's cwd,
symlinks followed) into `.os/`, or anywhere outside the workspace and the temp folder, are denied
before they run, with a message saying why and that memory needs no writing. Read of the server's token, the service's saved environment (by any
path, or by a hard link to either) or its logs is denied too, and so is any file-tool path that
resolves through /proc (or /dev/fd, /dev/stdin: links into it), where a link means something else to the CLI than here.

What keeps the agent's commands out of `.os/` is the kernel (isolation/policy.py): in `user` mode the CLI
runs as a user that owns nothing there, and this guard only spares the model a wasted turn. In
`sandbox` mode bubblewrap covers Bash only, so for the file tools this guard is the check. Bash
commands are not read here: a reader of shell text could be talked around (it was, 15 ways of 65,
docs/security.md), so in `none` mode, which is for development only, a command can change `.os/`.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..logs import get_logger
from ..paths import Layout

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import HookContext, HookInput, HookJSONOutput

log = get_logger(__name__)

WRITE_TOOLS = {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}
MATCHER = "|".join([*WRITE_TOOLS, "Read"])
MAX_LINK_HOPS = 40  # Linux's own limit on symlinks followed in one lookup

PROC_DENIAL = ("The file tools don't follow paths through /proc or /dev/fd (they name another process's "
               "view of the files); use the file's own path.")
SECRET_DENIAL = "That file is Sprite OS's own (its credentials or its logs); the agent can't read it."
OUTSIDE_DENIAL = "The agent's files live in the workspace (and the temp folder); it can't write elsewhere."
DENIAL = ("Sprite OS keeps .os/ (its code, settings and your memory) for itself: the agent can't change "
          "anything there. Memory is saved automatically; there is nothing to write.")


class ToolGuard:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._secrets = (layout.token_file, layout.service_env)
        self._private_dirs = (layout.logs_dir,)  # as the sandbox's denyRead (isolation/launch.py) has them

    def check(self, tool_name: str, tool_input: dict[str, Any], cwd: str | None = None) -> str | None:
        """Why this tool call may not run, or None if it may. Blocking (it resolves paths)."""
        base = Path(cwd) if cwd else self.layout.root
        if tool_name == "Read" or tool_name in WRITE_TOOLS:
            target = tool_input.get("file_path" if tool_name == "Read" else WRITE_TOOLS[tool_name])
            if isinstance(target, str) and through_proc(_absolute(target, base)):
                return f"{PROC_DENIAL} ({tool_name} of {target} was denied.)"
        if tool_name == "Read":
            target = tool_input.get("file_path")
            if isinstance(target, str) and self._secret(_absolute(target, base)):
                return SECRET_DENIAL
        elif tool_name in WRITE_TOOLS:
            target = tool_input.get(WRITE_TOOLS[tool_name])
            if isinstance(target, str) and self.layout.is_system_path(_absolute(target, base)):
                return f"{DENIAL} ({tool_name} to {target} was denied.)"
            if isinstance(target, str) and not self._writable(_absolute(target, base)):
                return f"{OUTSIDE_DENIAL} ({tool_name} to {target} was denied.)"
        return None

    def _writable(self, path: Path) -> bool:
        """Whether the file tools may write `path` (symlinks followed): in the workspace or the temp
        folder. In `sandbox` mode nothing else stops them (bubblewrap covers Bash only): the server's
        own code, or its user's shell startup files, are elsewhere."""
        real = Path(os.path.realpath(path))
        return any(real.is_relative_to(os.path.realpath(top)) for top in (self.layout.root, tempfile.gettempdir()))

    def _secret(self, path: Path) -> bool:
        """`path` is a secret (symlinks followed), or another name (a hard link) for one."""
        real = os.path.realpath(path)
        if any(real == os.path.realpath(secret) for secret in self._secrets):
            return True
        if any(Path(real).is_relative_to(os.path.realpath(d)) for d in self._private_dirs):
            return True
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return False
        for secret in self._secrets:
            try:
                if os.path.samestat(st, os.stat(secret)):
                    return True
            except OSError:
                continue
        return False

    async def hook(self, data: HookInput, _tool_use_id: str | None, _context: HookContext) -> HookJSONOutput:
        """The PreToolUse callback: {} (no opinion) or a denial with the reason, in the CLI's format."""
        if not isinstance(data, dict):
            return {}  # not a tool call the CLI could run: no opinion
        try:  # path resolution touches the disk: off the event loop
            call = cast(Mapping[str, Any], data)
            reason = await asyncio.to_thread(
                self.check, call.get("tool_name", ""), call.get("tool_input") or {}, call.get("cwd"))
        except Exception as exc:
            # Fail closed: a call the guard could not read may be one that writes .os/. The agent
            # gets a reason it can act on, and the turn goes on. (The type only: the message may
            # quote the path.)
            log.error("guard_failed", tool=cast(Mapping[str, Any], data).get("tool_name"), error=type(exc).__name__)
            reason = f"{DENIAL} (the guard could not check this call ({type(exc).__name__}); try a simpler one)"
        if reason is None:
            return {}
        log.warning("guard_denied", tool=cast(Mapping[str, Any], data).get("tool_name"))
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": reason}}


def _absolute(target: str, base: Path) -> Path:
    path = Path(os.path.expanduser(target))
    return path if path.is_absolute() else base / path


def through_proc(path: Path) -> bool:
    """Whether resolving `path` passes through /proc (or /dev/fd, /dev/stdin: links into it).
    Those links resolve by the process that follows them: /proc/self/cwd is the server's cwd here
    and the CLI's workspace there, so a check made here could not speak for the CLI."""
    pending, current, hops = list(path.parts[1:]), Path("/"), 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        current = current / part
        if current.parts[1:2] == ("proc",):
            return True
        try:
            target = os.readlink(current)
        except OSError:
            continue  # not a link, or not there (yet): a plain name
        hops += 1
        if hops > MAX_LINK_HOPS:
            return True  # a loop; the kernel would refuse it too
        link = Path(target)
        pending = [*link.parts[1:], *pending] if link.is_absolute() else [*link.parts, *pending]
        current = Path("/") if link.is_absolute() else current.parent
    return False
