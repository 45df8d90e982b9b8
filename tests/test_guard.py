"""The write guard: `.os/` is readable by the agent and never writable, by any tool or path."""

import os
from pathlib import Path

import pytest

from sprite_os.guard import WriteGuard
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
def guard(ws: Path) -> WriteGuard:
    return WriteGuard(Layout(ws))


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
def test_file_tools(guard: WriteGuard, ws: Path, tool: str, path: str, cwd: str, denied: bool) -> None:
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    reason = guard.check(tool, {key: path.format(ws=ws)}, str(ws / cwd))
    assert (reason is not None) == denied
    if denied:
        assert "Memory is saved automatically" in reason or "credentials" in reason


@pytest.mark.parametrize(("command", "denied"), [
    ("echo hi > .os/memory/user.md", True),
    ("echo hi >> {ws}/.os/memory/user.md", True),
    ("cat .os/memory/user.md", False),
    ("cat .os/memory/user.md | grep x", False),
    ("ls -la .os && wc -l .os/memory/*.md", False),
    ("find .os -name '*.md'", False),
    ("rm -rf .os", True),
    ("rm .os/memory/user.md", True),
    ("cp notes.md .os/memory/user.md", True),
    ("sed -i s/a/b/ .os/memory/user.md", True),
    ("python3 -c \"open('.os/memory/user.md','w').write('x')\"", True),
    ("cd .os/memory && echo x > user.md", True),
    ("tee documents/link/user.md < /dev/null", True),
    ("truncate -s0 documents/link/user.md", True),
    ("dd if=/dev/zero of=.os/memory/user.md", True),
    ("X=.os; rm -rf $X", True),
    ("rm -rf .", True),
    ("rm -rf {ws}", True),
    ("chmod -R 777 {ws}", True),
    ("find . -name '*.md' -delete", True),
    ("cat 'unbalanced .os", True),
    ("rm -rf documents/old", False),
    ("mv documents/a.txt documents/b.txt", False),
    ("find . -name '*.md'", False),
    ("echo ok 2>&1", False),
    ("echo ok > /dev/null", False),
    # Bypasses a review found: redirections through variables, brace expansion, attached options.
    ("D=.os; echo x > $D/memory/user.md", True),
    ("cat /tmp/x > \"$(echo .os)/memory/user.md\"", True),
    ("echo x | tee {{.os/memory/user.md,}}", True),  # braces doubled for str.format
    ("cp -t.os/memory /tmp/user.md", True),
    ("mv --target-directory=.os/memory /tmp/user.md", True),
    ("echo notes > documents/notes.md", False),
    # Read-only programs with options that write or run programs (a review found these).
    ("sort -o .os/memory/user.md documents/a", True),
    ("sort --out=.os/memory/user.md documents/a", True),  # GNU's abbreviated long option
    ("sort -uo.os/memory/user.md documents/a", True),
    ("uniq documents/a .os/memory/user.md", True),
    ("xxd documents/a .os/memory/user.md", True),
    ("tree -o .os/memory/user.md documents", True),
    ("rg --pre ./convert.sh x .os/memory", True),
    ("cat .os/memory/user.md | sort | uniq -c", False),
    ("uniq -f 2 .os/memory/user.md", False),
    ("tree .os && rg Ada .os/memory", False),
    # Disguised paths: quotes inside a word, variables, paths built by an interpreter.
    ("bash -c 'echo x > .o''s/memory/user.md'", True),
    ("D=.o; cd ${{D}}s/memory; echo x > user.md", True),
    ("python3 -c \"open(chr(46)+'os/memory/user.md','w').write('x')\"", True),
    ("find . -exec sh -c 'echo > $0' .o\\s/memory/user.md ;", True),
    # ...while ordinary work in the user space stays allowed.
    ("python3 script.py", False),
    ("echo $HOME", False),
    ("git commit -m \"x\"", False),
    ("git commit -m \"$(cat documents/msg)\" --author=\"Ada <a@b.c>\"", False),
    ("cd $HOME/documents && make", False),
    ("python3 -c 'import os; print(os.getcwd())' > documents/out.txt", False),
    ("grep -E 'a$' documents/x > documents/y", False),
    ("echo x > documents/memory/notes.txt", False),
    # Credentials: not even readable.
    ("cat .os/token", True),
    ("cat .os/tok*", True),
    ("grep -r x .os/state/service.env", True),
    ("cat $(echo .os/token)", True),
    ("git status", False),
    ("echo 'unbalanced", False),
    # Ordinary work a review found falsely denied: only the program runs code (not `python3` as an
    # argument), a sourced script is a script file, and only memory files' own names count.
    ("source .venv/bin/activate && pytest tests/memory/", False),
    (". .venv/bin/activate && pytest tests/memory/", False),
    ("git diff -- src/memory/ | awk '{{print $1}}'", False),
    ("apt install python3", False),
    ("sudo apt install -y python3 && cat documents/user.md", False),
    ("git commit -m \"fix user.md parser\"", False),
    ("grep -r \"memory/\" src", False),
    ("python3 -c 'print(1)'", False),
    ("cat documents/user.md", False),
    ("python3 -c 'import sys' > documents/USER.MD", False),  # not a memory file's name on disk
    ("python3 -m pytest documents/user.md", False),  # a module run by name, like a script file
    # ...while the program position is still found behind wrappers, find -exec and xargs.
    ("sudo -u ada python3 -c \"open(chr(46)+'os/memory/user.md','w')\"", True),
    ("timeout 5 perl -e \"open(F, '>', chr(46).'os/memory/user.md')\"", True),
    ("find documents -exec python3 -c \"open(chr(46)+'os/memory/user.md','w')\" ;", True),
    ("echo x | xargs -n 1 python3 -c \"open(chr(46)+'os/memory/user.md','w')\"", True),
    # A heredoc or here-string to an interpreter is code on stdin.
    ("python3 <<EOF\np = chr(46) + \"os/memory/user.md\"\nopen(p, mode=\"w\").write(p)\nEOF", True),
    ("python3 - <<'EOF'\np = chr(46) + \"os/memory/user.md\"\nopen(p, mode=\"w\").write(p)\nEOF", True),
    ("bash <<< 'cd ~/.o\"\"s/memory; echo x > user.md'", True),
    ("python3 <<EOF\nprint(1)\nEOF", False),
    ("bash <<< 'echo hello'", False),
    # A newline outside quotes separates commands, as `;` does (shlex reads it as a space), and a
    # comment starts only at a word's start (shlex ends a line at any `#`).
    ("ls\nrm -rf .os/memory", True),
    ("cd /tmp\nrm -rf {ws}/.os/memory", True),
    ("ls \\\nrm -rf .os/memory", False),  # a backslash-newline joins the lines: only `ls` runs
    ("ls -la \\\n  documents\nrm -rf .os/memory", True),
    ("ls # don't\nrm -rf .os/memory", True),  # a quote in a comment opens nothing
    ("ls\\\n#x; rm -rf .os/memory", True),  # `ls#x` is a word, not a comment
    ("echo a#b; rm -rf .os/memory", True),
    ("echo $'\\''\nrm -rf .os/memory\necho 'x'", True),  # `$'\''` is one quote character
    ("cat <<EOF | python3\nimport os\np = chr(46) + \"os/memory/user.md\"\nopen(p, \"w\").write(\"x\")\nEOF", True),
    ("cat <<'EOF' | python3\n# don't\np = chr(46) + \"os/memory/user.md\"\nEOF", True),
    ("cat <<EOF > documents/notes.md\nthen rm -rf .os/memory\nEOF", True),  # a body line is read too
    ("cd documents\nls -la\npython3 build.py", False),
    ("cat <<'EOF' > documents/notes.md\nIt's a note; see #3 & \"quotes\".\nEOF\nls documents", False),
    ("cat <<-EOF > documents/notes.md\n\tone; two # three\n\tEOF\ngit add documents/notes.md", False),
    ("git commit -m \"line one\nline two\"", False),
    ("echo 'a\nb' > documents/x.txt && echo $#", False),
    # Where bash and the line splitter could disagree, each physical line is judged too.
    ("echo $$'\\'\ncp /etc/hostname .os/memory/user.md\necho '\\'", True),
    ("cat <<$'EOF'\n$EOF\nls '\nEOF\ncp /etc/hostname .os/memory/user.md #'", True),
    ("cat <<lsls\nls\\\nls\necho 'x\necho ' ; cp /etc/hostname .os/memory/user.md ; echo '\n'", True),
    # Command substitution runs commands, whatever quotes or here-strings hold it.
    ('echo "$(cp /etc/hostname .os/memory/user.md)"', True),
    ('cat <<< "$(cp /etc/hostname .os/memory/user.md)"', True),
    ('echo "$(date)" > documents/today.txt', False),
])
def test_bash(guard: WriteGuard, ws: Path, command: str, denied: bool) -> None:
    reason = guard.check("Bash", {"command": command.format(ws=ws)}, str(ws))
    assert (reason is not None) == denied, reason


async def test_the_hook_denies_in_the_cli_format(guard: WriteGuard, ws: Path) -> None:
    out = await guard.hook({"tool_name": "Write", "tool_input": {"file_path": ".os/memory/user.md"}, "cwd": str(ws)},
                           None, None)
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert out["hookSpecificOutput"]["hookEventName"] == "PreToolUse"
    assert await guard.hook({"tool_name": "Write", "tool_input": {"file_path": "documents/a"}, "cwd": str(ws)},
                            None, None) == {}
    assert await guard.hook(None, None, None) == {}  # malformed input: no opinion, no exception


async def test_a_call_the_guard_cannot_check_is_denied(guard: WriteGuard, ws: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> str | None:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(guard, "check", broken)
    out = await guard.hook({"tool_name": "Bash", "tool_input": {"command": "ls"}, "cwd": str(ws)}, None, None)
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"  # fails closed: it may have written .os/
    assert "could not check" in out["hookSpecificOutput"]["permissionDecisionReason"]


def test_a_command_run_inside_os_must_be_read_only(guard: WriteGuard, ws: Path) -> None:
    inside = str(ws / ".os" / "memory")
    assert guard.check("Bash", {"command": "make"}, inside) is not None  # no argument names a path
    assert guard.check("Bash", {"command": "ls && cat user.md"}, inside) is None


@pytest.mark.parametrize(("command", "denied"), [
    ("cd ~", False),
    ("cd {ws}/documents", False),
    ("cd .. && pwd", False),
    ("pushd {ws}/documents && popd", False),
    ("echo x > user.md", True),
    ("cd . && rm user.md", True),
])
def test_the_agent_can_leave_os_by_cd(guard: WriteGuard, ws: Path, command: str, denied: bool) -> None:
    reason = guard.check("Bash", {"command": command.format(ws=ws)}, str(ws / ".os" / "memory"))
    assert (reason is not None) == denied, reason
