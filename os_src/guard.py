"""The write guard: the agent may read `.os/` but never change it, nor read its secrets.

A PreToolUse hook denies Write, Edit, MultiEdit and NotebookEdit on any path
that resolves (relative to the agent's cwd, symlinks followed) into `.os/`,
and Bash commands that would change anything there:

- a command whose arguments reach into `.os/` must be read-only (cat, ls, grep...);
- a redirection (`>`, `>>`) into `.os/` is denied;
- a line that mentions `.os` anywhere (inside `python -c`, `$(...)`, a variable)
  is allowed only if every command in it is read-only;
- recursive rm/chmod/chown/find -delete on a directory that contains `.os/` is denied;
- a command with a redirection counts as writing, wherever the redirection points;
- the server's token and the service's saved environment can't be read at all
  (a prompt injection must not be able to exfiltrate the key to this Sprite).

This is defence in depth, not a sandbox: a determined program can still find a
way. What makes memory trustworthy is that the daemon is its only writer, every
version is kept, and a change it did not make is treated as a person's edit.
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import os
import re
import shlex
from pathlib import Path
from typing import Any

from .logs import get_logger
from .paths import Layout

log = get_logger(__name__)

WRITE_TOOLS = {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}
MATCHER = "|".join([*WRITE_TOOLS, "Bash", "Read"])
HARMLESS_TARGETS = frozenset(("/dev/null", "/dev/stdout", "/dev/stderr"))

READ_ONLY = frozenset(
    """cat head tail less more ls wc grep egrep fgrep rg stat file du tree diff cmp sha256sum sha1sum md5sum
    realpath readlink basename dirname jq sort uniq cut strings od xxd hexdump test [ true false echo printf
    pwd find""".split()
)
WRAPPERS = frozenset("sudo env command nohup nice time timeout stdbuf builtin exec".split())
RECURSIVE_DESTRUCTIVE = frozenset("rm chmod chown chgrp rsync shred find".split())
FIND_WRITES = frozenset("-delete -exec -execdir -ok -okdir -fprint -fprint0 -fprintf -fls".split())
CONTROL = frozenset(";;& && || | |& & ; ( ) \n".split(" ")) | {"\n"}
_REDIRECT = re.compile(r"^\d*(>>?|>\||&>>?|<>)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OS_MENTION = re.compile(r"(?:^|[\s/'\"=:(`${,])\.os(?:$|[\s/'\"):;`|&>},])")

SECRET_DENIAL = "That file holds this Sprite's credentials; the agent can't read it."
DENIAL = ("Sprite OS keeps .os/ (its code, settings and your memory) for itself: the agent can read it "
          "but not change it. Memory is saved automatically; there is nothing to write.")


class WriteGuard:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._os_real = Path(os.path.realpath(layout.os_dir))
        self._secrets = {Path(os.path.realpath(p)) for p in (layout.token_file, layout.service_env)}

    def check(self, tool_name: str, tool_input: dict[str, Any], cwd: str | None = None) -> str | None:
        """Why this tool call may not run, or None if it may."""
        base = Path(cwd) if cwd else self.layout.root
        if tool_name == "Read":
            target = tool_input.get("file_path")
            if isinstance(target, str) and self._secret(target, base):
                return SECRET_DENIAL
            return None
        if tool_name in WRITE_TOOLS:
            target = tool_input.get(WRITE_TOOLS[tool_name])
            if isinstance(target, str) and self._touches(target, base):
                return f"{DENIAL} ({tool_name} to {target} was denied.)"
            return None
        if tool_name == "Bash":
            command = tool_input.get("command")
            if isinstance(command, str) and (why := self._bash(command, base)):
                return f"{DENIAL} ({why})"
        return None

    async def hook(self, data: Any, _tool_use_id: str | None, _context: Any) -> dict[str, Any]:
        try:  # path resolution and globbing touch the disk: off the event loop
            reason = await asyncio.to_thread(
                self.check, data.get("tool_name", ""), data.get("tool_input") or {}, data.get("cwd"))
        except Exception as exc:  # a broken guard must not break the agent; deny only on evidence
            log.error("guard_failed", error=repr(exc))
            return {}
        if reason is None:
            return {}
        log.warning("guard_denied", tool=data.get("tool_name"))
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": reason}}

    # ------------------------------------------------------------ paths

    def _expand(self, token: str, base: Path) -> list[str]:
        path = os.path.expandvars(os.path.expanduser(token))
        if any(c in path for c in "*?["):
            pattern = path if os.path.isabs(path) else str(base / path)
            matches = list(itertools.islice(glob.iglob(pattern), 1000))
            return matches or [path]
        return [path]

    def _touches(self, token: str, base: Path) -> bool:
        return any(self.layout.is_system_path(p, base) for p in self._expand(token, base) if p)

    def _secret(self, token: str, base: Path) -> bool:
        for p in self._expand(token, base):
            if p and Path(os.path.realpath(p if os.path.isabs(p) else base / p)) in self._secrets:
                return True
        return False

    def _contains_os(self, token: str, base: Path) -> bool:
        """True if `token` is a directory that holds .os/ (so a recursive change reaches it)."""
        for p in self._expand(token, base):
            real = Path(os.path.realpath(p if os.path.isabs(p) else base / p))
            if real in self._os_real.parents:
                return True
        return False

    # ------------------------------------------------------------ bash

    def _bash(self, command: str, base: Path) -> str | None:
        mentions = bool(_OS_MENTION.search(command)) or str(self.layout.os_dir) in command \
            or str(self._os_real) in command
        try:
            lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:
            return "the command could not be parsed" if mentions else None
        all_read_only = True
        for words in _simple_commands(tokens):
            program, args, targets = _split(words)
            paths = [p for a in args for p in _path_candidates(a)]
            if any(self._secret(p, base) for p in [*paths, *targets]):
                return SECRET_DENIAL
            for target in targets:
                if self._touches(target, base):
                    return f"a redirection writes into {target}"
            writes = any(t not in HARMLESS_TARGETS and not t.startswith("&") for t in targets)
            read_only = program in READ_ONLY and not writes and not (program == "find" and FIND_WRITES & set(args))
            all_read_only &= read_only or (program == "" and not writes)
            if not read_only and any(self._touches(p, base) for p in paths):
                return f"{program} would change files under .os/"
            if program in RECURSIVE_DESTRUCTIVE and _recursive(program, args) and any(
                    self._contains_os(p, base) for p in paths):
                return f"{program} would recursively change a directory that contains .os/"
        if mentions and not all_read_only:
            return "the command mentions .os and is not read-only"
        return None


def _path_candidates(arg: str) -> list[str]:
    """The paths an argument may name: itself, or the value of `--opt=VALUE` and `-xVALUE`."""
    if arg.startswith("--"):
        return [arg.split("=", 1)[1]] if "=" in arg else []
    if arg.startswith("-"):
        return [arg[2:]] if len(arg) > 2 else []
    return [arg]


def _simple_commands(tokens: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for token in tokens:
        if token in CONTROL or set(token) <= set(";&|()"):
            out.append([])
        else:
            out[-1].append(token)
    return [words for words in out if words]


def _split(words: list[str]) -> tuple[str, list[str], list[str]]:
    """(program, arguments, redirection targets) of one simple command."""
    targets, rest = [], []
    it = iter(range(len(words)))
    for i in it:
        word = words[i]
        if _REDIRECT.match(word) or word in ("<", "<<", "<<<"):
            if i + 1 < len(words) and word not in ("<", "<<", "<<<"):
                targets.append(words[i + 1])
            next(it, None)
            continue
        rest.append(word)
    while rest and (_ASSIGNMENT.match(rest[0]) or rest[0] in WRAPPERS):
        rest = rest[1:]
    program = os.path.basename(rest[0]) if rest else ""
    return program, rest[1:], targets


def _recursive(program: str, args: list[str]) -> bool:
    if program == "find":
        return bool(FIND_WRITES & set(args))
    if program in ("shred", "rsync"):
        return True
    return any(a in ("-r", "-R", "--recursive", "-rf", "-fr", "-Rf", "-fR") or
               (a.startswith("-") and not a.startswith("--") and ("r" in a or "R" in a)) for a in args)
