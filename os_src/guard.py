"""The write guard: the agent may read `.os/` but never change it, nor read its secrets.

A PreToolUse hook denies Write, Edit, MultiEdit and NotebookEdit on any path
that resolves (relative to the agent's cwd, symlinks followed) into `.os/`,
and Bash commands that would change anything there. A command is read line by line, as bash
runs it (a newline outside quotes separates commands like `;`; a heredoc's body lines are read as
lines too), and each line's simple commands are judged:

- a command whose arguments reach into `.os/` must be read-only (cat, ls, grep...),
  and a read-only program's options that write or run programs (`sort -o`,
  `uniq IN OUT`, `tree -o`, `rg --pre`...) make it not read-only;
- a redirection (`>`, `>>`) into `.os/` is denied;
- a line that mentions `.os` anywhere (inside `python -c`, `$(...)`, a variable)
  is allowed only if every command in it is read-only;
- a disguised line, whose words are built at run time (`$`, backticks, quotes or
  backslashes inside a word, code given to an interpreter as its program with
  `-c`/`-e`, on stdin, by a heredoc or here-string, eval, awk), is read again
  without its quotes and with its own variables substituted; it must be read-only
  if it then mentions `.os` or names a memory file as it is on disk (`user.md`,
  `transcript.db`...);
- a line run with its cwd inside `.os/` must be read-only (`cd` counts as
  read-only: it changes no file, and the agent must be able to leave);
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
    pwd find cd pushd popd""".split()
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
# Not `source`/`.`: a sourced script is like a script file run by name, which the guard doesn't read.
_ALWAYS_CODE = frozenset("eval awk gawk mawk nawk".split())
# A memory file's own name, as it is on disk, which a command whose words we can't read off its text
# may be building a path to. Not the bare `memory` directory (`tests/memory/` is ordinary work): a
# built `.os/memory` is caught by the `.os` mention, read after variables are substituted.
_MEMORY_NAME = re.compile(
    r"(?<![\w$.-])(?:(?:soul|os|tools|files|user|context)\.md|transcript\.db|memory\.db|\.history\b|"
    r"\.writer\.lock)")
WRAPPERS = frozenset("sudo env command nohup nice time timeout stdbuf builtin exec".split())
# A wrapper's options that take the next word as their value (`sudo -u ada`, `nice -n 5`).
WRAPPER_VALUES = {"sudo": frozenset("-u -g -C -D -h -p -r -t -U -R -T".split()), "env": frozenset("-u -C -S".split()),
                  "nice": frozenset(("-n",)), "timeout": frozenset(("-s", "-k")), "stdbuf": frozenset("-i -o -e".split())}
XARGS_VALUES = frozenset("-I -n -P -d -L -s -E -a -e -i -l".split())
HEREDOC = frozenset(("<<", "<<<"))
RECURSIVE_DESTRUCTIVE = frozenset("rm chmod chown chgrp rsync shred find".split())
FIND_WRITES = frozenset("-delete -exec -execdir -ok -okdir -fprint -fprint0 -fprintf -fls".split())
CONTROL = frozenset(";;& && || | |& & ; ( ) \n".split(" ")) | {"\n"}
_REDIRECT = re.compile(r"^\d*(>>?|>\||&>>?|<>)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_ASSIGNED = re.compile(r"(?:^|[\s;&|(])([A-Za-z_]\w*)=([^\s;&|()]*)")
_SUBSTITUTION = re.compile(r"\$\(|`|[<>]\(")
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
            if isinstance(command, str) and (why := self._bash(command, base) or self._by_line(command, base)):
                return f"{DENIAL} ({why})"
        return None

    def _by_line(self, command: str, base: Path) -> str | None:
        """A backstop for the line splitter: each physical line judged on its own, as written and
        with its quotes taken out. Where quoting or a heredoc makes bash and the splitter disagree
        on what a line is (a quote opened on one line may close on another), bash may still run
        any physical line, or the part of it between two quotes, as a command; denying one that
        would write .os/ is the safe reading."""
        if "\n" not in command:
            return None
        for line in command.replace("\\\n", "").replace("\r", "").split("\n"):
            for reading in (line, re.sub(r"[\"']", "", line)):
                if reading.strip() and (why := self._bash(reading, base)):
                    return why
        return None

    async def hook(self, data: Any, _tool_use_id: str | None, _context: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            return {}  # not a tool call the CLI could run: no opinion
        try:  # path resolution and globbing touch the disk: off the event loop
            reason = await asyncio.to_thread(
                self.check, data.get("tool_name", ""), data.get("tool_input") or {}, data.get("cwd"))
        except Exception as exc:
            # Fail closed: a call the guard could not read may be one that writes .os/. The agent
            # gets a reason it can act on, and the turn goes on. (The type only: the message may
            # quote the command.)
            log.error("guard_failed", tool=data.get("tool_name"), error=type(exc).__name__)
            reason = f"{DENIAL} (the guard could not check this call ({type(exc).__name__}); try a simpler one)"
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
        tokens: list[str] = []
        unparsed = False
        for line, body in _lines(command):  # lexed one line at a time: shlex reads `\n` as a space
            try:
                lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
                lexer.whitespace_split = True
                lexer.commenters = ""  # `_lines` dropped the comments; shlex would end one mid-word
                tokens += [*lexer, ";"]
            except ValueError:  # an unclosed quote: bash runs the lines before it, not this one
                unparsed |= not body
                tokens += [re.sub(r"['\"\\]", "", t) for t in re.findall(r"[;&|()<>]+|[^\s;&|()<>]+", line)]
                tokens.append(";")
        # `$(...)`, backticks and `<(...)` run commands the lexer sees only as words (inside quotes,
        # a here-string): whatever they hold, the line is not read-only.
        all_read_only = not _SUBSTITUTION.search(command)
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
        if unparsed and mentions:
            return "the command could not be parsed"
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
    """True if the command's program is an interpreter given code inline (`bash -c`, `python3 -c`,
    `perl -e`), on stdin, by a heredoc or here-string (`python3 <<EOF`, `bash <<< "..."`), or is
    eval or awk: the guard can't read the paths that code will use. Only the program counts (after
    wrappers, and the command `find -exec` or `xargs` runs): `apt install python3` runs no code. A
    script file (`python3 script.py`, `source env/bin/activate`) is run as it is: the guard does not
    read scripts."""
    rest = _redirections(words)[1]
    return _code_at(rest, _program_index(rest), heredoc=bool(HEREDOC & set(words)))


def _code_at(words: list[str], i: int | None, heredoc: bool = False) -> bool:
    if i is None:
        return False
    name, args = os.path.basename(words[i]), words[i + 1:]
    if name in _ALWAYS_CODE:
        return True
    if name == "find":
        return any(_code_at(args, _program_index(args, j + 1)) for j, a in enumerate(args[:-1]) if a in FIND_WRITES)
    if name == "xargs":
        j = 0
        while j < len(args) and args[j].startswith("-"):
            j += 2 if args[j] in XARGS_VALUES else 1
        return _code_at(args, _program_index(args, j))
    if not _INTERPRETER.match(name):
        return False
    if heredoc:
        return True  # code on stdin, from the command line itself
    for arg in args:
        if arg == "-" or arg.startswith("--eval") or arg.startswith("--command"):
            return True
        if not arg.startswith("-"):
            return False  # a script file
        if set(arg[1:]) & set("ceEpr"):
            return True
    return True  # code on stdin


def _program_index(words: list[str], start: int = 0) -> int | None:
    """Where the program is among a command's words (redirections removed): after variable
    assignments and wrappers (`sudo -u ada`, `env -i X=1`, `timeout 5`, `nice -n 5`)."""
    i = start
    while i < len(words):
        word = words[i]
        if _ASSIGNMENT.match(word):
            i += 1
            continue
        if word not in WRAPPERS:
            return i
        wrapper, i = word, i + 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-":
            option, i = words[i], i + 1
            if wrapper == "command" and option in ("-v", "-V"):
                return i - 2  # `command -v python3` only looks the name up
            if option == "--":
                break
            if option in WRAPPER_VALUES.get(wrapper, ()):
                i += 1
        if wrapper == "timeout" and i < len(words) and words[i][:1].isdigit():
            i += 1  # the duration
    return None


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


def _lines(command: str) -> list[tuple[str, bool]]:
    """The lines bash runs one after another, as (text, is a heredoc body line). A newline outside
    quotes ends a line, a backslash-newline outside quotes joins two, and a newline inside quotes
    (`git commit -m "a<newline>b"`) stays; a comment (`#` starting a word) is dropped. The lines
    after one that opens a heredoc (`<<EOF`, `<<-'EOF'`), up to its delimiter, are its body: each
    is read as a line of its own, its quotes literal, so a body line that mentions `.os` or writes
    there is judged like a command (conservative, as code on stdin may run it)."""
    out: list[tuple[str, bool]] = []
    line: list[str] = []
    pending: list[tuple[str, bool]] = []  # heredocs opened on this line: (delimiter, strip tabs)
    quote, prev, i, n = "", "", 0, len(command)
    while i < n:
        c = command[i]
        if quote:  # ' literal; " and $' honour backslash escapes
            if c == "\\" and quote != "'" and i + 1 < n:
                line.append(command[i:i + 2])
                i += 2
                continue
            if c == ("'" if quote in "'$" else '"'):
                quote = ""
            line.append(c)
        elif c == "\\":
            if command[i + 1:i + 2] != "\n":  # a backslash-newline disappears
                line.append(command[i:i + 2])
                prev = command[i + 1:i + 2]
            i += 2
            continue
        elif c in "'\"":
            quote = "$" if prev == "$" and c == "'" else c
            line.append(c)
        elif c == "#" and prev in ("", " ", "\t", *";&|()<>"):
            while i < n and command[i] != "\n":  # a comment
                i += 1
            continue
        elif c == "\n":
            out.append(("".join(line), False))
            line, prev, i = [], "", i + 1
            while pending and i < n:
                end = command.find("\n", i)
                end = n if end < 0 else end
                text, i = command[i:end], end + 1
                if (text.lstrip("\t") if pending[0][1] else text) == pending[0][0]:
                    pending.pop(0)
                else:
                    out.append((text, True))
            pending = []
            continue
        elif command.startswith("<<<", i):
            line.append("<<<")
            prev, i = "<", i + 3
            continue
        elif command.startswith("<<", i):
            j = i + 3 if command.startswith("<<-", i) else i + 2
            if delimiter := _heredoc_delimiter(command, j):
                pending.append((delimiter, j == i + 3))
            line.append(command[i:j])
            prev, i = "<", j
            continue
        else:
            line.append(c)
        prev = c
        i += 1
    out.append(("".join(line), False))
    return [(text, body) for text, body in out if text.strip()]


def _heredoc_delimiter(command: str, i: int) -> str:
    """The word after `<<` at `i`, without its quotes (`'EOF'`, `"EOF"`, `\\EOF` all end at `EOF`)."""
    while i < len(command) and command[i] in " \t":
        i += 1
    word: list[str] = []
    while i < len(command) and command[i] not in " \t\n;&|()<>":
        c = command[i]
        if c in "'\"":
            end = command.find(c, i + 1)
            end = len(command) if end < 0 else end
            word.append(command[i + 1:end])
            i = end + 1
        elif c == "\\":
            word.append(command[i + 1:i + 2])
            i += 2
        else:
            word.append(c)
            i += 1
    return "".join(word)


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
    targets, rest = _redirections(words)
    i = _program_index(rest)
    if i is None:
        return "", [], targets
    return os.path.basename(rest[i]), rest[i + 1:], targets


def _redirections(words: list[str]) -> tuple[list[str], list[str]]:
    """(redirection targets, the other words) of one simple command."""
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
    return targets, rest


def _recursive(program: str, args: list[str]) -> bool:
    if program == "find":
        return bool(FIND_WRITES & set(args))
    if program in ("shred", "rsync"):
        return True
    return any(a in ("-r", "-R", "--recursive", "-rf", "-fr", "-Rf", "-fR") or
               (a.startswith("-") and not a.startswith("--") and ("r" in a or "R" in a)) for a in args)
