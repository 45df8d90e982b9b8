"""The agent's limits, through the real CLI as its own user (SPRITE_ISOLATION=user): what it leaves
in its home and /tmp does not outlive the session nor reach anyone else, another user cannot get in
its way, and a deployed Sprite never runs it weaker in silence.

(Starving the server: tests/test_starvation_e2e.py. Spending: tests/test_agent_spend_e2e.py.)
"""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from devkit.processes import refused_serve
from sprite_os.config import Settings
from sprite_os.isolation.policy import AgentUser
from tests.conftest import (
    agent_namespace,
    client_factory,
    in_namespace,
    processes_of,
    running,
    wait_for,
)

pytestmark = pytest.mark.e2e

TURN = 90.0  # a CLI's start and a turn, on a busy machine


def bash(command: str) -> ToolCall:
    return ToolCall("Bash", {"command": command, "description": "a step of the test"})


def cli_root(uid: int, workspace: Path) -> Path:
    """The agent's file system as its CLI sees it (its own mount namespace), for root to look into."""
    for pid in processes_of(uid):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(workspace)):
                return Path(f"/proc/{pid}/root")
        except OSError:
            continue
    raise AssertionError(f"no process of uid {uid} works in {workspace}")


async def test_an_rc_file_edited_in_one_session_runs_nothing_in_the_next(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    """The foothold: lines a prompt injection adds to the agent's shell start-up files (and a job
    it leaves running) would act again in every later session. Each session's home is new."""
    ran = agent_workspace / "documents" / "rc-ran"
    line = f"touch {ran}; (setsid sleep 2718 >/dev/null 2>&1 &)"
    plant = "; ".join(f"echo '{line}' >> ~/{name}" for name in (".bashrc", ".profile", ".bash_profile", ".zshrc"))
    script = agent_workspace / "documents" / "plant.sh"  # run as a script: past the CLI's own check on rc files
    bridge.agent.script(Turn(ToolCall("Write", {"file_path": str(script), "content": f"{plant}\n"}),
                             bash("bash documents/plant.sh; cat ~/.bashrc > documents/planted; echo $HOME > documents/home"),
                             Text("Planted.")),
                        Turn(bash("echo $HOME > documents/home2; ls -A ~ > documents/home-listing; "
                                  "bash -lic true; sh -lc true; echo second > documents/second"), Text("Fine.")))
    on_disk = sorted(agent_user.home.iterdir())
    async with running(agent_settings) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="user_message", text="make yourself at home")
        assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
        assert (agent_workspace / "documents" / "planted").exists(), [f["summary"] for f in c.of("tool_result")]
        assert line in (agent_workspace / "documents" / "planted").read_text()  # the attack went in
        first = agent_namespace(agent_user.uid, agent_workspace)
        await c.send(type="new_session")
        await c.until("session_started", timeout=TURN)
        await wait_for(lambda: in_namespace(first) == [], timeout=15, what="the first session's processes ended")
        await c.send(type="user_message", text="and now?")
        assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
    docs = agent_workspace / "documents"
    assert (docs / "second").read_text() == "second\n"  # the second session's shell ran, logins and all
    assert (docs / "home2").read_text() == (docs / "home").read_text() == f"{agent_user.home}\n"
    assert not ran.exists(), "a line planted in an rc file ran in the next session"
    assert (docs / "home-listing").read_text().split() in ([], [".claude"], [".claude", ".claude.json"]), \
        (docs / "home-listing").read_text()
    assert not any(b"2718" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in processes_of(agent_user.uid)
                   if Path(f"/proc/{pid}/cmdline").exists())
    assert sorted(agent_user.home.iterdir()) == on_disk  # nothing reached the home on the disk either


async def test_a_setuid_file_left_in_tmp_is_no_one_elses_to_run(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    name = f"sush-{agent_workspace.parent.name}"
    bridge.agent.script(Turn(bash(f"cp /bin/sh /tmp/{name} && chmod 4755 /tmp/{name} && cp /tmp/{name} /var/tmp/{name} "
                                  f"&& chmod 4755 /var/tmp/{name} && ls -l /tmp/{name} > documents/ls.part && "
                                  "mv documents/ls.part documents/ls; sleep 600"), Text("never")))
    async with running(agent_settings) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="user_message", text="leave a door open")
        await wait_for(lambda: (agent_workspace / "documents" / "ls").exists(), timeout=TURN, what="the file was left")
        assert (agent_workspace / "documents" / "ls").read_text().startswith("-rwsr-xr-x")  # it is there, set-uid
        root = cli_root(agent_user.uid, agent_workspace)
        assert (root / "tmp" / name).exists() and (root / "var/tmp" / name).exists()  # in the agent's own /tmp
        for where in ("/tmp", "/var/tmp"):
            assert not Path(where, name).exists()  # ... which is no one else's
            stranger = await asyncio.to_thread(subprocess.run, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                                       f"{where}/{name}", "-c", "id -u"], capture_output=True, text=True, check=False)
            assert stranger.returncode != 0 and stranger.stdout == "", stranger
        mounts = (root.parent / "mountinfo").read_text().splitlines()
        for where in ("/tmp", "/var/tmp", "/dev/shm", str(agent_user.home)):
            mount = [m for m in mounts if m.split()[4] == where][-1]  # the last mounted there is what is seen
            assert "nosuid" in mount.split()[5] and "nodev" in mount.split()[5], mount  # and not set-uid even there
        await c.send(type="interrupt")
        await c.until("turn_complete", timeout=TURN)


async def test_a_setuid_shell_left_in_run_lock_or_any_world_writable_folder_stays_in_the_session(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    """/run/lock (and /var/lock, its link) is world-writable on the root file system, which is not
    nosuid: a set-uid, set-gid copy of sh left there ran as the agent for any local user. Every
    world-writable folder the agent can reach is a private tmpfs of its session."""
    name = f"sush-{agent_workspace.parent.name}"
    bridge.agent.script(Turn(bash(f"cp /bin/sh /run/lock/{name} && chmod 6755 /run/lock/{name} && "
                                  f"ls -l /run/lock/{name} > documents/ls; echo done > documents/done"), Text("Left.")))
    async with running(agent_settings) as app, client_factory(app.port) as connect:
        private = (await app.health())["limits"]["tmp"]["private"]
        c = await connect(hello={})
        await c.send(type="user_message", text="leave a door open")
        assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
    left = Path("/run/lock", name)
    try:
        assert (agent_workspace / "documents" / "done").exists()
        assert (agent_workspace / "documents" / "ls").read_text().startswith("-rwsr-sr-x")  # made, in its session
        assert not left.exists()  # ... and not on the host
        stranger = await asyncio.to_thread(subprocess.run, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                            "--", str(left), "-c", "id -u"],
                                           capture_output=True, text=True, check=False)
    finally:
        left.unlink(missing_ok=True)  # what the old launcher let through: the test leaves no door open
    assert stranger.returncode != 0 and stranger.stdout == "", stranger
    assert "/run/lock" in private and "/tmp" in private


def shm_segments(uid: int, table: str) -> list[str]:
    """The SysV shared memory segments owned by `uid` in a /proc/sysvipc/shm listing."""
    return [line for line in table.splitlines()[1:] if line.split()[7] == str(uid)]


async def test_shared_memory_made_in_one_session_is_gone_in_the_next_and_on_the_host(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    """SysV shared memory and POSIX message queues belong to an IPC namespace, not to a process: a
    segment the agent made outlived its session (read back in the next, listed by ipcs after the
    server stopped). Each CLI has an IPC namespace of its own."""
    docs = agent_workspace / "documents"
    bridge.agent.script(Turn(bash("ipcmk -M 1048576 > documents/made; cat /proc/sysvipc/shm > documents/shm1"),
                             Text("Planted.")),
                        Turn(bash("cat /proc/sysvipc/shm > documents/shm2"), Text("Looked.")))
    try:
        async with running(agent_settings) as app, client_factory(app.port) as connect:
            c = await connect(hello={})
            await c.send(type="user_message", text="plant")
            assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
            assert shm_segments(agent_user.uid, (docs / "shm1").read_text()), (docs / "made").read_text()
            await c.send(type="new_session")
            await c.until("session_started", timeout=TURN)
            await c.send(type="user_message", text="look")
            assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
        assert shm_segments(agent_user.uid, (docs / "shm2").read_text()) == []  # not in the next session
        assert shm_segments(agent_user.uid, Path("/proc/sysvipc/shm").read_text()) == []  # nor on the host
    finally:
        for line in shm_segments(agent_user.uid, Path("/proc/sysvipc/shm").read_text()):  # what the old launcher left
            await asyncio.to_thread(subprocess.run, ["ipcrm", "-m", line.split()[1]], check=False)


async def test_the_agents_oom_score_is_held_where_the_kernel_allows_and_said_where_not(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    """The agent's processes are the OOM killer's first choice (oom_score_adj 1000), and it tried to
    lower its own to 0. Root's write sets the kernel's floor as well, if root holds CAP_SYS_RESOURCE;
    where a container dropped it, /healthz says the floor does not hold, and why."""
    bridge.agent.script(Turn(bash("cat /proc/self/oom_score_adj > documents/before; "
                                  "(echo 0 > /proc/self/oom_score_adj) 2>/dev/null; "
                                  "cat /proc/self/oom_score_adj > documents/after"), Text("Tried.")))
    async with running(agent_settings) as app, client_factory(app.port) as connect:
        oom = (await app.health())["limits"]["oom"]
        c = await connect(hello={})
        await c.send(type="user_message", text="lower it")
        assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
    docs = agent_workspace / "documents"
    capable = "CapEff" in (status := Path("/proc/self/status").read_text()) and bool(
        int(next(line for line in status.splitlines() if line.startswith("CapEff:")).split()[1], 16) >> 24 & 1)
    assert (docs / "before").read_text() == "1000\n"
    assert oom["score_adj"] == 1000 and oom["floor"] is capable
    if capable:
        assert (docs / "after").read_text() == "1000\n"  # the kernel's floor: the agent cannot lower it
    else:
        assert "CAP_SYS_RESOURCE" in oom["why"] and "can lower" in oom["why"]  # not in force, and said so


async def test_another_users_tmp_claude_folder_does_not_stop_the_agent(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser) -> None:
    """The CLI keeps its temporary files in /tmp/claude-<uid> and refuses one it does not own: any
    local user who made it first stopped every turn. The agent's /tmp is its own."""
    squatted = Path(f"/tmp/claude-{agent_user.uid}")
    aside = squatted.with_name(f"{squatted.name}.aside-{os.getpid()}")
    if squatted.exists():  # the agent's own, from an earlier version that shared /tmp
        squatted.rename(aside)
    squatted.mkdir(mode=0o700)
    os.chown(squatted, 65534, 65534)
    try:
        bridge.agent.script(Turn(bash("echo ran > documents/ran"), Text("Done.")))
        async with running(agent_settings) as app, client_factory(app.port) as connect:
            c = await connect(hello={})
            await c.send(type="user_message", text="work")
            done = await c.until("turn_complete", timeout=TURN)
        assert done["status"] == "completed", c.of("error")
        assert (agent_settings.workspace / "documents" / "ran").read_text() == "ran\n"
    finally:
        squatted.rmdir()
        if aside.exists():
            aside.rename(squatted)


async def test_healthz_says_the_mode_why_and_the_limits_in_force(
        agent_settings: Settings, agent_user: AgentUser) -> None:
    async with running(replace(agent_settings, agent_max_processes=300, agent_memory_max=1 << 30)) as app:
        health = await app.health()
    assert health["isolation"] == "user" and health["isolation_reason"] == f"SPRITE_ISOLATION=user, as {agent_user.name}"
    limits = health["limits"]
    assert limits["processes"]["max"] == 300 and "RLIMIT_NPROC=300" in limits["processes"]["by"]
    assert limits["cpu"]["by"][-1] == "nice 10" and limits["tmp"]["private"][:2] == ["/tmp", "/var/tmp"]
    assert set(limits["disk"]) == {"reserved_bytes", "holds", "why"}
    if Path("/sys/fs/cgroup/pids").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert any("pids.max=300" in by for by in limits["processes"]["by"]), limits  # a cgroup on this machine
        assert limits["memory"]["max_bytes"] == 1 << 30


# ---------------------------------------------------------------- never weaker in silence


def start_deployed(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    ws = tmp_path / "ws"
    (ws / ".os").mkdir(parents=True, exist_ok=True)
    if not (ws / ".os" / "current").is_symlink():
        os.symlink("releases/1.0", ws / ".os" / "current")  # what bootstrap/deploy.py makes
    full = {**os.environ, "SPRITE_WORKSPACE": str(ws), "SPRITE_OS_PORT": "0", "SPRITE_ISOLATION": "", **env}
    run = refused_serve(full)
    assert run.stdout == "[]\n", run.stdout  # refused before the server's import: no agent SDK loaded
    return run


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent's own user needs root")
@pytest.mark.parametrize(("user", "says"), [
    ("sprite-no-such-user", "the agent's user 'sprite-no-such-user' does not exist"),
    ("nobody", "the user 'nobody' was not made for the agent"),
    ("root", "the agent's user 'root' is root"),
])
def test_a_deployed_start_without_the_agents_own_user_is_refused(tmp_path: Path, user: str, says: str) -> None:
    run = start_deployed(tmp_path, SPRITE_AGENT_USER=user)
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert "a deployed Sprite runs its agent as its own user, and cannot" in last and says in last, last
    assert "SPRITE_ISOLATION=sandbox" in last  # and how to run weaker, if that is what the operator means


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent's own user needs root")
def test_every_process_of_a_service_user_survives_a_refused_start(tmp_path: Path) -> None:
    """Named after a service's user, a start that went ahead would have killed all its processes."""
    sleeper = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sleep", "60"])
    try:
        asyncio.run(wait_for(lambda: os.stat(f"/proc/{sleeper.pid}").st_uid == 65534, timeout=10))
        assert start_deployed(tmp_path, SPRITE_AGENT_USER=pwd.getpwuid(65534).pw_name).returncode == 2
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
