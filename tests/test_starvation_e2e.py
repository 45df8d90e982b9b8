"""The agent cannot starve the server, through the real CLI as its own user (SPRITE_ISOLATION=user):
a fork bomb, a 20 GB allocation, `dd` until the disk is full, a busy loop on every core, each
during a turn. Meanwhile the server answers /healthz within 1 s; the person's interrupt ends the
turn within 2 s; capture records every turn; the next session starts normally.

Each attack has a control that shows the test can tell: a bounded version of it that the limits
let through (and that ran), or, for the disk, the same attack on a file system with no reserve for
the server, where capture fails. The limits are set small for the tests (SPRITE_AGENT_MAX_PROCESSES,
SPRITE_AGENT_MEMORY_MAX) and the disk is a small loop-mounted ext4, never the machine's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os import procfs
from sprite_os.config import Settings
from sprite_os.isolation.policy import AgentUser
from sprite_os.server import SpriteOS
from tests.conftest import TOKEN, Client, client_factory, processes_of, running, wait_for

pytestmark = pytest.mark.e2e

TURN = 120.0  # a CLI's start and a turn, on a busy machine
HEALTHZ_WITHIN = 1.0
INTERRUPT_WITHIN = 2.0
MIB = 1024 * 1024


def bash(command: str) -> ToolCall:
    return ToolCall("Bash", {"command": command, "description": "a step of the test", "timeout": 600_000})


def healthz_seconds(port: int) -> float:
    started = time.monotonic()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        response.read()
    return time.monotonic() - started


@dataclass
class Outcome:
    healthz: list[float]  # seconds, while the attack ran
    interrupted_in: float  # from the interrupt to turn_complete
    status: str  # the attacked turn's
    next_turn: str  # the next session's turn's status
    recorded: list[str]  # the person's messages transcript.db holds
    group: list[Path]  # the agent's control group, while it ran


def recorded(workspace: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(workspace / ".os" / "memory" / "transcript.db")) as db:
        return [row[0] for row in db.execute("SELECT user_message FROM observations ORDER BY id")]


def group_file(group: list[Path], name: str) -> Path | None:
    return next((d / name for d in group if (d / name).exists()), None)


async def attack_during_a_turn(settings: Settings, bridge: MockBridge, attack: str,
                               under_way: Callable[[SpriteOS], bool], *,
                               while_it_runs: Callable[[SpriteOS], None] | None = None) -> Outcome:
    """Run `attack` (then a long sleep) as the agent's Bash command; once `under_way`, time /healthz
    and the person's interrupt; then a new session's turn. What the server and capture made of it."""
    bridge.agent.script(Turn(bash(f"{attack}; sleep 900"), Text("never said")), Turn(Text("Back to work.")))
    async with running(settings) as app, client_factory(app.port) as connect:
        group = list(app.launch.group_dirs)
        c = await connect(hello={})
        await c.send(type="user_message", text="the attack")
        try:
            await wait_for(lambda: under_way(app), timeout=TURN, what="the attack is under way")
        except TimeoutError:
            raise AssertionError(f"the attack never got under way: {await tool_results(c)}") from None
        if while_it_runs is not None:
            while_it_runs(app)
        healthz = []
        for _ in range(5):
            healthz.append(await asyncio.to_thread(healthz_seconds, app.port))
            await asyncio.sleep(0.2)
        started = time.monotonic()
        await c.send(type="interrupt")
        done = await c.until("turn_complete", timeout=TURN)
        interrupted_in = time.monotonic() - started
        next_turn = await next_session(c)
    return Outcome(healthz, interrupted_in, done["status"], next_turn, recorded(settings.workspace), group)


async def tool_results(c: Client) -> list[str]:
    """What the CLI said of the turn's tool calls (why an attack did not start, say)."""
    with contextlib.suppress(TimeoutError):
        await c.until("turn_complete", timeout=5)
    return [str(f.get("summary")) for f in c.frames if f["type"] == "tool_result"]


async def next_session(c: Client) -> str:
    await c.send(type="new_session")
    await c.until("session_started", timeout=TURN)
    await c.send(type="user_message", text="the next turn")
    return str((await c.until("turn_complete", timeout=TURN))["status"])


def assert_the_server_held(outcome: Outcome, ended: tuple[str, ...] = ("interrupted",)) -> None:
    print(f"healthz max {max(outcome.healthz):.3f} s; interrupted in {outcome.interrupted_in:.3f} s")  # for -s
    assert max(outcome.healthz) < HEALTHZ_WITHIN, outcome.healthz
    assert outcome.status in ended and outcome.interrupted_in < INTERRUPT_WITHIN, outcome
    assert outcome.next_turn == "completed"
    assert outcome.recorded == ["the attack", "the next turn"]  # capture recorded every turn


@pytest.fixture
def limited(agent_settings: Settings) -> Settings:
    return replace(agent_settings, agent_max_processes=96, agent_memory_max=768 * MIB)  # the CLI alone holds ~250 MiB


# ---------------------------------------------------------------- a fork bomb


def agent_processes(app: SpriteOS, uid: int) -> int:
    current = group_file(list(app.launch.group_dirs), "pids.current")
    return int(current.read_text()) if current else len(processes_of(uid))


async def test_a_fork_bomb_ends_at_the_limit_and_the_server_holds(
        limited: Settings, bridge: MockBridge, agent_user: AgentUser) -> None:
    bomb = "bomb() { bomb | bomb & }; bomb"
    outcome = await attack_during_a_turn(limited, bridge, bomb,
                                         lambda app: agent_processes(app, agent_user.uid) >= 90)
    # The CLI shares the agent's process limit: when the bomb holds every pid, the CLI may fail to
    # start a thread of its own and die (SIGILL), and the turn ends `error` at once instead of
    # `interrupted`. Either way the turn ends in time, is recorded, and the next session is normal.
    assert_the_server_held(outcome, ended=("interrupted", "error"))


async def test_control_forks_under_the_limit_all_run(limited: Settings, bridge: MockBridge,
                                                     agent_user: AgentUser) -> None:
    """The bomb above reached the limit and was held there; twenty processes, under it, all run."""

    def sleeping(_app: SpriteOS) -> bool:
        return sum(b"sleep\x00600" in procfs.cmdline(p) for p in processes_of(agent_user.uid)) == 20

    outcome = await attack_during_a_turn(limited, bridge, "for i in $(seq 20); do sleep 600 & done", sleeping)
    assert_the_server_held(outcome)


# ---------------------------------------------------------------- 20 GB


ALLOCATE = "perl -e '$x = \"x\" x ({n}); print \"allocated\\n\"' > documents/alloc.out 2>&1; echo $? > documents/alloc.rc"


async def test_a_20_gb_allocation_is_ended_at_the_memory_limit_and_the_server_holds(
        limited: Settings, bridge: MockBridge) -> None:
    rc = limited.workspace / "documents" / "alloc.rc"
    outcome = await attack_during_a_turn(limited, bridge, ALLOCATE.format(n="20 * 1024**3"), lambda app: rc.exists())
    assert rc.read_text().strip() != "0"  # killed at the limit (137), or refused its memory
    assert "allocated" not in (limited.workspace / "documents" / "alloc.out").read_text()
    assert_the_server_held(outcome)


async def test_control_an_allocation_under_the_memory_limit_succeeds(limited: Settings, bridge: MockBridge) -> None:
    rc = limited.workspace / "documents" / "alloc.rc"
    outcome = await attack_during_a_turn(limited, bridge, ALLOCATE.format(n="64 * 1024**2"), lambda app: rc.exists())
    assert rc.read_text().strip() == "0"
    assert (limited.workspace / "documents" / "alloc.out").read_text() == "allocated\n"
    assert_the_server_held(outcome)


# ---------------------------------------------------------------- a full disk


def mounted_at(mount: Path) -> bool:
    """Whether anything is mounted at `mount` (as /proc/self/mountinfo escapes its path)."""
    escaped = str(mount).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    return any(line.split()[4] == escaped for line in Path("/proc/self/mountinfo").read_text().splitlines())


def holders(mount: Path) -> list[int]:
    """The processes with their directory, root, or a file in the file system at `mount`, but the
    test's own: killing it would end the whole test worker, not free the disk (a lazy unmount does)."""
    found = []
    for pid in procfs.pids():
        if pid == os.getpid():
            continue
        base = Path(f"/proc/{pid}")
        with contextlib.suppress(OSError):
            links = [os.readlink(base / "cwd"), os.readlink(base / "root"),
                     *(os.readlink(fd) for fd in (base / "fd").iterdir())]
            if any(link == str(mount) or link.startswith(f"{mount}/") for link in links):
                found.append(pid)
    return found


def unmount(mount: Path, image: Path | None = None) -> None:
    """Unmount for certain: end what holds the file system (an agent's leftover `dd`), unmount, lazily if
    it is still busy, and free the image's loop device. An unmount that failed silently left loop-mounted
    images behind, their files deleted."""
    for _ in range(3):
        if not mounted_at(mount):
            break
        for pid in holders(mount):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        if subprocess.run(["umount", str(mount)], capture_output=True, check=False).returncode != 0:
            time.sleep(0.5)
    if mounted_at(mount):
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False)
    if image is not None:
        looped = subprocess.run(["losetup", "-n", "-O", "NAME", "-j", str(image)], capture_output=True, text=True,
                                check=False).stdout.split()
        for device in looped:
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
    assert not mounted_at(mount), f"{mount} is still mounted"


@pytest.fixture
def small_disk(agent_workspace: Path) -> Iterator[Callable[[int], Path]]:
    """A small ext4 file system, loop-mounted, with `reserved` percent of it kept for root; the
    workspace goes inside it. Never the machine's own disk."""
    if shutil.which("mkfs.ext4") is None or shutil.which("losetup") is None:
        pytest.skip("a loop-mounted ext4 needs e2fsprogs and util-linux")
    mounted: list[tuple[Path, Path]] = []

    def make(reserved: int) -> Path:
        image, mount = agent_workspace.parent / "disk.img", agent_workspace.parent / "disk"
        subprocess.run(["truncate", "-s", "128M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", str(reserved), str(image)], check=True)
        mount.mkdir()
        mounted.append((mount, image))
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        os.chmod(mount, 0o755)
        return mount / "workspace"

    try:
        yield make
    finally:
        for mount, image in mounted:
            unmount(mount, image)


def test_a_busy_test_disk_is_unmounted_for_certain(tmp_path: Path) -> None:
    """The disk tests' teardown: a plain umount failed (busy: the agent's `dd` still in it) and left the
    image loop-mounted. What holds it is ended, and the teardown checks nothing is left mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "sprite-test-busy", str(mount)], check=True)
    holder = subprocess.Popen(["sleep", "600"], cwd=mount)
    try:
        assert subprocess.run(["umount", str(mount)], capture_output=True, check=False).returncode != 0  # busy
        unmount(mount)
        assert holder.wait(timeout=10) == -9 and not mounted_at(mount)
    finally:
        holder.kill()
        holder.wait()
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False)


FILL = "dd if=/dev/zero of=documents/fill bs=1M 2> documents/dd.err; echo $? > documents/dd.rc"


async def test_dd_until_the_disk_is_full_leaves_the_server_its_reserve(
        agent_settings: Settings, bridge: MockBridge, small_disk: Callable[[int], Path]) -> None:
    workspace = small_disk(20)
    settings = replace(agent_settings, workspace=workspace)
    rc = workspace / "documents" / "dd.rc"
    async with running(replace(settings, memory_batch_turns=10_000)) as app:
        limits = (await app.health())["limits"]
    assert limits["disk"]["holds"], limits["disk"]  # /healthz says the reserve is in force
    outcome = await attack_during_a_turn(settings, bridge, FILL, lambda app: rc.exists())
    assert "No space left on device" in (workspace / "documents" / "dd.err").read_text()
    st = os.statvfs(workspace)
    assert st.f_bavail * st.f_frsize < MIB  # full, for the agent
    assert_the_server_held(outcome)


async def test_control_without_a_reserve_a_full_disk_costs_capture_its_record(
        agent_settings: Settings, bridge: MockBridge, agent_workspace: Path) -> None:
    """The same attack on a file system that keeps nothing for root (a tmpfs; ext4 keeps some for
    root even at -m 0): the server's own writes fail, so the assertion above that capture recorded
    every turn can fail; and /healthz said there was no reserve."""
    mount = agent_workspace.parent / "disk"
    mount.mkdir()
    mount_tmpfs = ["mount", "-t", "tmpfs", "-o", "size=64M,mode=755", "sprite-test-disk", str(mount)]
    await asyncio.to_thread(subprocess.run, mount_tmpfs, check=True)
    try:
        workspace = mount / "workspace"
        settings = replace(agent_settings, workspace=workspace)
        rc = workspace / "documents" / "dd.rc"
        async with running(settings) as app:
            disk = (await app.health())["limits"]["disk"]
        assert not disk["holds"] and "reserved for root" in disk["why"], disk
        outcome = await attack_during_a_turn(settings, bridge, FILL, lambda app: rc.exists())
        assert outcome.recorded != ["the attack", "the next turn"], outcome.recorded
    finally:
        await asyncio.to_thread(unmount, mount)


# ---------------------------------------------------------------- every core


def cpu_group(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next((line.split(":", 2)[2] for line in lines if "cpu" in line.split(":")[1].split(",")
                 or line.startswith("0::")), "")


# The niceness the run started at (0, or what `nice make test` gave it): the server keeps it, and
# the agent's processes sit 10 lower (nicer) (`nice -n 10`, at most 19).
RUN_NICE = os.nice(0)


def nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


async def test_a_busy_loop_on_every_core_runs_below_the_servers_weight(
        limited: Settings, bridge: MockBridge, agent_user: AgentUser) -> None:
    loops = f"for i in $(seq {2 * (os.cpu_count() or 1)}); do (while :; do :; done) & done; echo busy > documents/busy"
    spinning: list[int] = []

    def look(app: SpriteOS) -> None:
        spinning.extend(p for p in processes_of(agent_user.uid) if Path(f"/proc/{p}/stat").read_text().split()[2] == "R")

    outcome = await attack_during_a_turn(limited, bridge, loops,
                                         lambda app: (limited.workspace / "documents" / "busy").exists(),
                                         while_it_runs=look)
    assert_the_server_held(outcome)
    assert spinning  # the loops were running when the server answered
    # Control: the server (this process) keeps the run's weight (nice 0 unless the run was niced), outside the agent's group.
    assert nice(os.getpid()) == RUN_NICE and all(g.name not in cpu_group(os.getpid()) for g in outcome.group)


async def test_the_agents_processes_sit_in_its_group_at_a_lower_weight(
        limited: Settings, bridge: MockBridge, agent_user: AgentUser) -> None:
    bridge.agent.script(Turn(bash("cd .; sleep 600"), Text("never said")))  # the CLI refuses a sleep that leads
    async with running(limited) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="user_message", text="wait")
        try:
            await wait_for(lambda: any(b"sleep\x00600" in procfs.cmdline(p) for p in processes_of(agent_user.uid)),
                           timeout=TURN, what="the sleep started")
        except TimeoutError:
            raise AssertionError(f"no sleep: {await tool_results(c)}") from None
        [sleeper] = [p for p in processes_of(agent_user.uid) if b"sleep\x00600" in procfs.cmdline(p)]
        group = list(app.launch.group_dirs)
        assert nice(sleeper) == min(RUN_NICE + 10, 19) and nice(os.getpid()) == RUN_NICE
        if weight := group_file(group, "cpu.shares") or group_file(group, "cpu.weight"):
            assert weight.parent.name in cpu_group(sleeper) and weight.parent.name not in cpu_group(os.getpid())
            assert int(weight.read_text()) < (1024 if weight.name == "cpu.shares" else 100)
        await c.send(type="interrupt")
        await c.until("turn_complete", timeout=TURN)
