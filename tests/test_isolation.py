"""The isolation mode's choice (pure), the launcher it writes, and the owners and modes it sets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from devkit.harness import wait_for
from sprite_os.config import load_settings
from sprite_os.deploy_contract import apply_ownership
from sprite_os.errors import ConfigError
from sprite_os.isolation.launch import AgentLaunch, cached_cli, launcher_script
from sprite_os.isolation.policy import AgentUser, Facts, Isolation, choose
from sprite_os.isolation.probe import unreachable
from sprite_os.paths import Layout

AGENT = AgentUser("sprite-agent", 999, 995, Path("/var/lib/sprite-agent"))
ROOT_WITH_USER = Facts(root=True, agent_user=AGENT, switch_tools=None, sandbox_problem=None, deployed=False)
NOT_ROOT = replace(ROOT_WITH_USER, root=False)
NOTHING = replace(NOT_ROOT, sandbox_problem="bwrap not installed")


@pytest.mark.parametrize(("requested", "facts", "mode"), [
    ("auto", ROOT_WITH_USER, "user"),
    ("auto", replace(ROOT_WITH_USER, agent_user=None), "sandbox"),
    ("auto", NOT_ROOT, "sandbox"),
    ("auto", replace(ROOT_WITH_USER, switch_tools="setpriv not installed"), "sandbox"),
    ("auto", replace(ROOT_WITH_USER, unreachable="/root (mode 700)"), "sandbox"),
    ("auto", NOTHING, "none"),
    ("user", ROOT_WITH_USER, "user"),
    ("sandbox", ROOT_WITH_USER, "sandbox"),
    ("none", ROOT_WITH_USER, "none"),
    ("auto", replace(ROOT_WITH_USER, deployed=True), "user"),
    ("sandbox", replace(ROOT_WITH_USER, deployed=True), "sandbox"),  # weaker, as the operator named
])
def test_the_mode_is_the_first_the_machine_allows(requested: str, facts: Facts, mode: str) -> None:
    chosen = choose(requested, "sprite-agent", facts)
    assert chosen.mode == mode
    assert (chosen.agent_user is not None) == (mode == "user")
    assert chosen.reason.startswith("SPRITE_ISOLATION=" if requested != "auto" else "auto: ")
    if requested == "auto" and mode != "user":
        assert "not user, as" in chosen.reason  # the log, /healthz and the banner say why not user


@pytest.mark.parametrize(("requested", "facts", "says"), [
    ("user", NOT_ROOT, "not root"),
    ("user", replace(ROOT_WITH_USER, agent_user=None), "does not exist"),
    ("user", replace(ROOT_WITH_USER, agent_user=replace(AGENT, uid=0)), "is root"),
    ("user", replace(ROOT_WITH_USER, unreachable="/root (mode 700)"), "can't reach the workspace: /root"),
    ("sandbox", NOTHING, "bwrap not installed"),
    ("none", replace(ROOT_WITH_USER, deployed=True), "never runs its agent without isolation: SPRITE_ISOLATION=none"),
    ("auto", replace(NOTHING, deployed=True), "runs its agent as its own user, and cannot: the server is not root"),
    # never weaker in silence: a deployed Sprite that could run its CLI's sandbox still refuses
    ("auto", replace(NOT_ROOT, deployed=True), "runs its agent as its own user, and cannot"),
    ("auto", replace(ROOT_WITH_USER, deployed=True, agent_user=None), "does not exist"),
    ("auto", replace(ROOT_WITH_USER, deployed=True, unreachable="/srv (mode 700)"), "can't reach the workspace"),
    # never a service's or a person's user
    ("user", replace(ROOT_WITH_USER, agent_user=replace(AGENT, marked=False)), "was not made for the agent"),
    ("auto", replace(ROOT_WITH_USER, deployed=True, agent_user=replace(AGENT, marked=False)), "not made for the agent"),
    ("nope", ROOT_WITH_USER, "must be one of auto, user, sandbox, none"),
])
def test_what_cannot_be_had_is_refused_with_the_reason(requested: str, facts: Facts, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")) as info:
        choose(requested, "sprite-agent", facts)
    assert info.value.exit_code == 2


def test_settings_read_the_mode_and_the_user_and_refuse_bad_ones() -> None:
    settings = load_settings({"SPRITE_ISOLATION": "sandbox", "SPRITE_AGENT_USER": "agent7"})
    assert (settings.isolation, settings.agent_user) == ("sandbox", "agent7")
    assert load_settings({}).isolation == "auto" and load_settings({}).agent_user == "sprite-agent"
    with pytest.raises(ConfigError, match="SPRITE_ISOLATION must be one of"):
        load_settings({"SPRITE_ISOLATION": "root"})
    with pytest.raises(ConfigError, match="SPRITE_AGENT_USER"):
        load_settings({"SPRITE_AGENT_USER": "a:b"})


def test_an_unmarked_user_under_auto_off_a_deployed_sprite_falls_back_saying_why() -> None:
    chosen = choose("auto", "postgres", replace(ROOT_WITH_USER, agent_user=replace(AGENT, name="postgres", marked=False)))
    assert chosen.mode == "sandbox" and "'postgres' was not made for the agent" in chosen.reason


def test_the_launcher_drops_to_the_user_after_asking_for_the_death_signal_again(tmp_path: Path) -> None:
    import shlex

    script = launcher_script(Path("/cache/claude"), AGENT, workspace=Path("/workspace"))
    assert script.startswith("#!/bin/sh\n") and script.rstrip().endswith('"$@"')
    words = shlex.split(script.split("/proc/self/oom_score_adj\n", 1)[1])
    inner = words[words.index("-c") + 1]
    assert inner.splitlines()[-1].endswith('/cache/claude "$@"')
    words = words[:words.index("-c")] + inner.split()
    # outer setpriv (root) keeps a KILL for the server's death; unshare's child loses its own across the
    # uid switch (the kernel clears it), so the setpriv that switches sets it again (after switching).
    setprivs = [i for i, w in enumerate(words) if w.endswith("/setpriv") or w == "setpriv"]
    deathsigs = [i for i, w in enumerate(words) if w == "--pdeathsig"]
    assert len(setprivs) == len(deathsigs) == 2 and setprivs[1] < words.index("--reuid=999") and setprivs[1] < deathsigs[1]
    assert {"--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", "--no-new-privs", "--init-groups"} <= set(words)


def test_the_cli_copy_is_linked_once_per_version(tmp_path: Path) -> None:
    source = tmp_path / "bundled" / "claude"
    source.parent.mkdir()
    source.write_bytes(b"#!/bin/sh\n")
    (source.parent / "claude.version").write_text("2.1.329 (Claude Code)\n")
    first = cached_cli(source, tmp_path / "cache")
    assert first.name == "claude" and first.parent.name.startswith("2.1.329-") and first.read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE(first.stat().st_mode) == 0o755 and stat.S_IMODE(first.parent.stat().st_mode) == 0o755
    assert cached_cli(source, tmp_path / "cache") == first


def test_a_closed_directory_above_the_workspace_is_named(tmp_path: Path) -> None:
    stranger = replace(AGENT, uid=os.getuid() + 12345, gid=os.getgid() + 12345, name="nobody-here")
    assert unreachable(tmp_path / "ws", stranger) is not None  # pytest's base is 0700
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp is open to all
    try:
        closed = base / "closed"
        (closed / "ws").mkdir(parents=True)
        os.chmod(base, 0o755)
        os.chmod(closed, 0o700)
        assert unreachable(closed / "ws", stranger) == f"{closed} (mode 700)"
        os.chmod(closed, 0o711)
        assert unreachable(closed / "ws", stranger) is None
    finally:
        shutil.rmtree(base)


def test_prompt_file_replaces_the_argument_and_goes_when_discarded(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    launch = AgentLaunch(layout, Isolation("none"))
    launch.prepare()
    prompt = "x" * 300_000 + "\0 NUL and all"
    system_prompt = launch.write_prompt(prompt)
    assert system_prompt == {"type": "file", "path": str(layout.os_dir / "agent" / "boot-prompt.md")}
    assert Path(system_prompt["path"]).read_text() == prompt
    assert launch.cli_path() is None and launch.env() == {} and launch.settings() is None
    launch.discard_prompt()
    assert not Path(system_prompt["path"]).exists()
    launch.discard_prompt()  # twice: nothing to do


def test_sandbox_settings_deny_writes_to_os_and_reads_of_secrets(tmp_path: Path) -> None:
    import json

    layout = Layout(tmp_path)
    sandbox = json.loads(AgentLaunch(layout, Isolation("sandbox")).settings() or "{}")["sandbox"]
    assert sandbox["enabled"] and sandbox["failIfUnavailable"] and not sandbox["allowUnsandboxedCommands"]
    assert sandbox["filesystem"]["denyWrite"] == [str(layout.os_dir.resolve())]
    assert str(layout.token_file.resolve()) in sandbox["filesystem"]["denyRead"]


@pytest.mark.skipif(os.geteuid() != 0, reason="owners can only be given away by root")
def test_ownership_keeps_the_agent_out_of_os_and_gives_it_user_space(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    layout = Layout(root)
    layout.ensure()
    layout.token_file.write_text("t" * 20)
    os.chmod(layout.token_file, 0o644)
    (layout.memory_dir / "user.md").write_text("x")
    os.chmod(layout.memory_dir / "user.md", 0o666)
    os.chown(layout.memory_dir / "user.md", 4242, 4242)  # an agent-owned file left in .os/ by an old bug
    (root / "documents" / "old.md").write_text("from the days of one user")
    (root / "loose.txt").write_text("top level")
    uid, gid = 4243, 4244
    apply_ownership(root, uid, gid, deep=True)

    def owner(path: Path) -> tuple[int, int, int]:
        st = path.lstat()
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)

    assert owner(root) == (0, gid, 0o1770)
    assert owner(layout.os_dir) == (0, 0, 0o711)
    assert owner(layout.os_dir / "agent") == (0, gid, 0o750)
    assert owner(layout.memory_dir) == (0, 0, 0o700)
    assert owner(layout.token_file) == (0, 0, 0o600)
    assert owner(layout.memory_dir / "user.md") == (0, 0, 0o644)
    assert owner(root / "documents")[:2] == owner(root / "documents" / "old.md")[:2] == (uid, gid)
    assert owner(root / "loose.txt")[:2] == (uid, gid)
    apply_ownership(root, uid, gid, deep=True)  # idempotent
    assert owner(root) == (0, gid, 0o1770)


@pytest.mark.skipif(os.geteuid() != 0, reason="owners can only be given away by root")
def test_a_file_removed_from_os_while_the_deep_pass_walks_it_is_passed_over(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy's deep pass walks `.os/` while its server may run (the deploy restarts it after): the
    server's temporary files come and go. One removed between the walk's listing and its turn is
    passed over, not the end of the deploy."""
    root = tmp_path / "ws"
    layout = Layout(root)
    layout.ensure()
    names = [f"write-{i}.tmp" for i in range(8)]
    for name in names:
        (layout.memory_dir / name).write_text("x")
        os.chown(layout.memory_dir / name, 4242, 4242)  # each one to take back
    lchown, kept = os.lchown, []

    def taken_back(path: str | Path, uid: int, gid: int) -> None:
        if Path(path).parent == layout.memory_dir and not kept:  # the first: the others go meanwhile
            kept.append(Path(path).name)
            for name in names:
                if name != kept[0]:
                    (layout.memory_dir / name).unlink()
        lchown(path, uid, gid)

    monkeypatch.setattr(os, "lchown", taken_back)
    apply_ownership(root, 4243, 4244, deep=True)
    assert [p.name for p in layout.memory_dir.glob("*.tmp")] == kept
    assert (layout.memory_dir / kept[0]).stat().st_uid == 0


def test_none_is_said_loudly_at_start_and_refused_once_deployed(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    layout = Layout(tmp_path)
    layout.ensure()
    with capture_logs() as logs:
        assert AgentLaunch(layout).resolve("none", "sprite-agent").mode == "none"
    warning = next(e for e in logs if e["event"] == "isolation_none")
    assert warning["log_level"] == "warning" and "can change .os/" in warning["detail"]
    os.symlink("releases/1.0", layout.os_dir / "current")  # what bootstrap/deploy.py makes
    with pytest.raises(ConfigError, match="never runs its agent without isolation"):
        AgentLaunch(layout).resolve("none", "sprite-agent")


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another uid needs root")
def test_every_process_of_the_uid_is_killed(tmp_path: Path) -> None:
    import subprocess

    from sprite_os.isolation.launch import kill_processes_of

    uid = 4246  # no one's: only this test's processes run as it
    sleepers = [subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "sleep", "60"],
                                 start_new_session=True) for _ in range(2)]
    try:
        asyncio.run(wait_for(lambda: all(os.stat(f"/proc/{p.pid}").st_uid == uid for p in sleepers), timeout=10,
                             what="each sleeper runs as the uid (setpriv has switched)"))
        assert sorted(kill_processes_of(uid)) == sorted(p.pid for p in sleepers)
        assert [p.wait(5) for p in sleepers] == [-9, -9]
    finally:
        for p in sleepers:
            p.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="owners can only be given away by root")
def test_a_hard_link_in_user_space_does_not_give_the_agent_someone_elses_file(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    Layout(root).ensure()
    elsewhere = tmp_path / "root-owned.conf"
    elsewhere.write_text("root's")
    os.link(elsewhere, root / "documents" / "grab.conf")
    apply_ownership(root, 4243, 4244, deep=True)
    assert elsewhere.stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_a_folder_swapped_for_a_symlink_mid_walk_gives_the_agent_nothing_outside(tmp_path: Path) -> None:
    """The hostile review's race: while a deploy's deep pass walks user space, the agent swaps one
    of its folders with a symlink to a root-only folder holding the same names (renameat2's
    RENAME_EXCHANGE, atomically, again and again). A walk that chowns by path follows the swapped
    link (it gave 6,950 of 20,000 root files away); one that goes by directory descriptors can't."""
    import ctypes
    import threading

    from sprite_os.deploy_contract import apply_ownership

    victim = tmp_path / "victim"
    victim.mkdir()
    names = [f"f{i:04d}" for i in range(1500)]
    for name in names:
        (victim / name).write_text("root's\n")
    ws = tmp_path / "ws"
    (ws / ".os").mkdir(parents=True)
    apply_ownership(ws, 4247, 4248, deep=True)
    docs = ws / "documents"
    (docs / "d").mkdir()
    for name in names:
        (docs / "d" / name).touch()
    (docs / "s").symlink_to(victim)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            libc.renameat2(-100, str(docs / "d").encode(), -100, str(docs / "s").encode(), 2)  # RENAME_EXCHANGE

    racer = threading.Thread(target=swap)
    racer.start()
    try:
        for _ in range(8):
            apply_ownership(ws, 4247, 4248, deep=True)
    finally:
        stop.set()
        racer.join()
    given = [n for n in names if (victim / n).stat().st_uid != 0]
    assert given == [], f"{len(given)} root files were given to the agent"


@pytest.mark.skipif(os.geteuid() != 0, reason="owners need root")
def test_a_user_folder_the_agent_made_a_file_or_a_symlink_stops_nothing(tmp_path: Path) -> None:
    from sprite_os.deploy_contract import apply_ownership
    from sprite_os.paths import Layout

    ws = tmp_path / "ws"
    (ws / ".os").mkdir(parents=True)
    apply_ownership(ws, 4247, 4248, deep=True)
    (ws / "documents").rmdir()
    (ws / "documents").symlink_to("/nonexistent")
    (ws / "artifacts").rmdir()
    (ws / "artifacts").write_text("not a folder\n")
    Layout(ws).ensure()  # the server's start
    apply_ownership(ws, 4247, 4248, deep=True)  # a deploy's
    assert (ws / "documents").is_symlink() and (ws / "artifacts").is_file()


def test_the_sandbox_names_what_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    from sprite_os.isolation import probe

    monkeypatch.setattr(probe.shutil, "which", lambda tool: None if tool == "socat" else f"/usr/bin/{tool}")
    assert probe.sandbox_problem() == "socat not installed (Debian: apt-get install bubblewrap socat)"
    monkeypatch.setattr(probe.sys, "platform", "win32")
    assert probe.sandbox_problem() == "the CLI has no sandbox on win32"


@pytest.mark.parametrize(("name", "home", "shell", "uid", "gecos", "adopted"), [
    ("sprite-agent", "/var/lib/sprite-agent", "/usr/sbin/nologin", 999, "", True),  # as an earlier release made it
    ("sprite-agent", "/var/lib/sprite-agent", "/bin/bash", 999, "", False),  # someone logs in as it
    ("sprite-agent", "/home/sprite-agent", "/usr/sbin/nologin", 999, "", False),
    ("sprite-agent", "/var/lib/sprite-agent", "/usr/sbin/nologin", 999, "Sprite Agent Co.", False),
    ("postgres", "/var/lib/postgres", "/usr/sbin/nologin", 105, "", False),  # a service with the same shape
    ("nobody", "/nonexistent", "/usr/sbin/nologin", 65534, "nobody", False),
])
def test_only_the_old_default_agent_user_is_adopted_unmarked(name: str, home: str, shell: str, uid: int,
                                                             gecos: str, adopted: bool) -> None:
    from sprite_os.deploy_contract import made_by_an_earlier_release

    assert made_by_an_earlier_release(name, home, shell, uid, gecos) is adopted


@pytest.mark.skipif(os.geteuid() != 0, reason="users are made by root")
def test_the_agents_user_is_made_marked_with_an_empty_home_and_a_persons_is_refused() -> None:
    import pwd
    import subprocess

    from devkit.host import remove_user
    from sprite_os.deploy_contract import AGENT_MARK, AgentUserRefused, ensure_agent_user

    made, person = f"sprite-m{os.getpid()}", f"sprite-p{os.getpid()}"
    try:
        uid, _gid, home = ensure_agent_user(made)
        entry = pwd.getpwnam(made)
        assert entry.pw_gecos == AGENT_MARK and entry.pw_uid == uid and entry.pw_shell.endswith("nologin")
        assert list(home.iterdir()) == [] and stat.S_IMODE(home.stat().st_mode) == 0o700  # no /etc/skel
        assert ensure_agent_user(made)[0] == uid  # idempotent
        subprocess.run(["useradd", "--system", "--shell", "/bin/bash", person], check=True)
        with pytest.raises(AgentUserRefused, match=f"the user '{person}' exists and was not made for the agent"):
            ensure_agent_user(person)
        assert pwd.getpwnam(person).pw_gecos == ""  # left as it was
    finally:
        for name in (made, person):
            with contextlib.suppress(KeyError):
                remove_user(name)


def test_old_cli_copies_no_process_runs_are_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sprite_os.isolation import launch

    cache = tmp_path / "cli"
    for name in ("1-old", "2-old-running", "3-recent", "4-current"):
        (cache / name).mkdir(parents=True)
        (cache / name / "claude").write_text("#!/bin/sh\n")
    import time

    now = time.time()
    day_ago = now - launch.CLI_KEPT - 60
    for name in ("1-old", "2-old-running", "4-current"):
        os.utime(cache / name, (day_ago, day_ago))
    monkeypatch.setattr(launch.procfs, "pids", lambda: iter([1]))
    monkeypatch.setattr(launch.procfs, "exe", lambda pid: str(cache / "2-old-running" / "claude"))
    removed = launch.prune_cli_copies(cache / "4-current" / "claude", cache, now=now)
    assert removed == ["1-old"]
    assert sorted(p.name for p in cache.iterdir()) == ["2-old-running", "3-recent", "4-current"]


def test_the_agents_default_memory_limit_is_all_but_the_servers_eighth() -> None:
    """README's default for SPRITE_AGENT_MEMORY_MAX: an eighth of memory is kept for the server,
    512 MiB of it at least, but never more than half."""
    from sprite_os.isolation.resources import default_memory

    gib, mib = 1 << 30, 1 << 20
    assert default_memory(24 * gib) == 21 * gib  # an eighth kept: 3 GiB
    assert default_memory(2 * gib) == 2 * gib - 512 * mib  # an eighth would be 256 MiB: 512 kept
    assert default_memory(768 * mib) == 384 * mib  # 512 would be more than half: half kept
