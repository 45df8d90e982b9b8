"""The write guard: the agent may read `.os/` but never change it, nor read its secrets.

A PreToolUse hook denies Write, Edit, MultiEdit and NotebookEdit on any path
that resolves (relative to the agent's cwd, symlinks followed) into `.os/`,
and Bash commands that would change anything there:

- a command whose arguments reach into `.os/` must be read-only (cat, ls, grep...),
  and a read-only program's options that write or run programs (`sort -o`,
  `uniq IN OUT`, `tree -o`, `rg --pre`...) make it not read-only;
- a redirection (`>`, `>>`) into `.os/` is denied;
- a line that mentions `.os` anywhere (inside `python -c`, `$(...)`, a variable)
  is allowed only if every command in it is read-only;
- a disguised line, whose words are built at run time (`$`, backticks, quotes or
  backslashes inside a word, code given to an interpreter with `-c`/`-e`/stdin,
  eval, awk), is read again without its quotes and with its own variables
  substituted; it must be read-only if it then mentions `.os` or names a memory
  file (`memory/`, `user.md`, `transcript.db`...);
- a line run with its cwd inside `.os/` must be read-only;
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
    realpath readlink basename dirname jq sort uniq cut strings od hexdump test [ true false echo printf
    pwd find""".split()
)  # not xxd: `xxd IN OUT` writes OUT. The options below that write or run programs are checked too.
# Per read-only program: short option letters and long-option names that write a file or run a program.
WRITE_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sort": ("oT", ("output", "compress-program", "temporary-directory")),
    "tree": ("o", ("output",)),
    "less": ("oO", ("log-file", "LOG-FILE")),
    "file": ("C", ("compile",)),
    "rg": ("", ("pre",)),
}
# Programs that run code given inline (-c, -e) or on stdin rather than from a script file.
_INTERPRETER = re.compile(r"^(?:(?:ba|da|k|z|fi)?sh|python[\d.]*|pypy[\d.]*|perl|ruby|node(?:js)?|php|lua|deno|bun|"
                          r"osascript)$")
_ALWAYS_CODE = frozenset("eval source . awk gawk mawk nawk".split())
# Names that, in a command whose words we can't read off its text, suggest it builds a path into
# memory: the memory directory next to a slash, or a memory file's own name.
_MEMORY_NAME = re.compile(
    r"(?<![\w$.-])(?:memory/|(?<=/)memory\b|(?:soul|os|tools|files|user|context)\.md|transcript\.db|"
    r"memory\.db|\.history\b|\.writer\.lock)", re.IGNORECASE)
WRAPPERS = frozenset("sudo env command nohup nice time timeout stdbuf builtin exec".split())
RECURSIVE_DESTRUCTIVE = frozenset("rm chmod chown chgrp rsync shred find".split())
FIND_WRITES = frozenset("-delete -exec -execdir -ok -okdir -fprint -fprint0 -fprintf -fls".split())
CONTROL = frozenset(";;& && || | |& & ; ( ) \n".split(" ")) | {"\n"}
_REDIRECT = re.compile(r"^\d*(>>?|>\||&>>?|<>)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_ASSIGNED = re.compile(r"(?:^|[\s;&|(])([A-Za-z_]\w*)=([^\s;&|()]*)")
_VARIABLE = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")
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
        disguised, plain = _unquote(command)
        mentions = self._mentions(command) or (disguised and self._mentions(plain))
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
            read_only = program in READ_ONLY and not writes and not _writes_by_option(program, args)
            all_read_only &= read_only or (program == "" and not writes)
            disguised |= _runs_code(words)
            if not read_only and any(self._touches(p, base) for p in paths):
                return f"{program} would change files under .os/"
            if program in RECURSIVE_DESTRUCTIVE and _recursive(program, args) and any(
                    self._contains_os(p, base) for p in paths):
                return f"{program} would recursively change a directory that contains .os/"
        if all_read_only:
            return None
        if mentions:
            return "the command mentions .os and is not read-only"
        if disguised and _MEMORY_NAME.search(plain):
            return "the command builds words at run time, names a memory file and is not read-only"
        if self.layout.is_system_path(base):
            return "the command runs inside .os and is not read-only"
        return None

    def _mentions(self, text: str) -> bool:
        return bool(_OS_MENTION.search(text)) or str(self.layout.os_dir) in text or str(self._os_real) in text


def _writes_by_option(program: str, args: list[str]) -> bool:
    """True if a read-only program is given an option (or operand) that writes or runs something."""
    if program == "find":
        return bool(FIND_WRITES & set(args))
    if program == "uniq":  # `uniq IN OUT`; -f/-s/-w take a number
        operands = [a for i, a in enumerate(args) if not a.startswith("-") and
                    (i == 0 or args[i - 1] not in ("-f", "-s", "-w"))]
        return len(operands) > 1
    letters, names = WRITE_OPTIONS.get(program, ("", ()))
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:  # GNU tools accept any unambiguous prefix
            given = arg[2:].split("=", 1)[0]
            if any(name.startswith(given) for name in names):
                return True
        elif arg.startswith("-") and set(arg[1:]) & set(letters):
            return True
    return False


def _runs_code(words: list[str]) -> bool:
    """True if the command hands an interpreter code inline (`bash -c`, `python3 -c`, `perl -e`,
    eval, awk) or on stdin, where the guard can't read the paths it will use. A script file
    (`python3 script.py`) is run as it is: the guard does not read scripts."""
    for i, word in enumerate(words):
        name = os.path.basename(word)
        if name in _ALWAYS_CODE and (i == 0 or name != "."):
            return True
        if not _INTERPRETER.match(name):
            continue
        for arg in words[i + 1:]:
            if arg == "-" or arg.startswith("--eval") or arg.startswith("--command"):
                return True
            if not arg.startswith("-"):
                break  # a script file (or an interpreter named as an argument)
            if set(arg[1:]) & set("ceEpr"):
                return True
        else:
            return True  # code on stdin
    return False


def _unquote(command: str) -> tuple[bool, str]:
    """(disguised, plain). Disguised: the words the shell runs differ from the text, through an
    expansion (`$`, backticks) or a quote or backslash inside a word (`.o''s`). Plain: the text
    without quotes and backslashes, with variables assigned in the same line substituted, which
    undoes the simple disguises (`D=.o; cd ${D}s`)."""
    disguised, out, quote = False, [], ""
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'" and c != "'":  # single quotes: all literal
            out.append(c)
        elif c in "'\"" and quote in ("", c):
            disguised |= _glued(command, i, opening=not quote)
            quote = "" if quote else c
        elif c == "\\":
            disguised |= not quote
            i += 1
            out.append(command[i:i + 1])
        else:
            disguised |= c in "$`"
            out.append(c)
        i += 1
    plain = "".join(out)
    assigned = dict(_ASSIGNED.findall(plain))
    return disguised, _VARIABLE.sub(lambda m: assigned.get(m[1], m[0]), plain)


def _glued(command: str, i: int, opening: bool) -> bool:
    """True if the quote at `i` is inside a word: `-m "x"` and `--opt="x"` are not, `.o''s` is."""
    if opening:
        return i > 0 and command[i - 1] not in " \t\n=(;|&<>"
    return i + 1 < len(command) and command[i + 1] not in " \t\n;|&<>)"


def _path_candidates(arg: str) -> list[str]:
    """The paths an argument may name: itself, or the value of `--opt=VALUE` and `-xVALUE`."""
    if arg.startswith("--"):
        return [arg.split("=", 1)[1]] if "=" in arg else []
    if arg.startswith("-"):  # in a cluster (`-uoFILE`) the value may start after any letter
        return [arg[2:]] + [arg[i:] for i in range(3, len(arg)) if arg[i] in "./~"] if len(arg) > 2 else []
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
