"""The agent's control group: a pid limit, a memory limit and a CPU weight below the server's, over
every process the agent's CLI starts (isolation/launch.py puts each CLI in it).

cgroup v2 where the machine gives the server's cgroup the controllers, v1 where it mounts their
hierarchies (a hybrid machine may use some of each). The group is a child of the server's own
cgroup in each hierarchy, so whatever holds the server (a service's slice, a container, a test
runner's limits) holds the agent too. Made at the server's start, removed at its stop; a group
left by a server that died is removed by the next start.

The parsing is pure (`hierarchies`); `AgentGroup.create` and `remove` do the I/O, as root.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..logs import get_logger

log = get_logger(__name__)

CONTROLLERS = ("pids", "memory", "cpu")
CPU_WEIGHT_V2 = 90  # the server's is the default, 100
CPU_SHARES_V1 = 922  # the server's is the default, 1024
# Nine tenths: what protects the server is that the agent's processes, however many, weigh together
# less than it does. Half (512) left a turn with a Bash command twice as slow on a machine busy with
# other work, where every other process weighs 1024 too (bench/turns.py: isolation).
PREFIX = "sprite-agent-"  # sprite-agent-<server pid>-<random>: the server that made it, for the sweep
_NAME = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+$")


@dataclass(frozen=True)
class Hierarchy:
    version: Literal[1, 2]
    mount: Path  # where it is mounted
    path: str  # the server's cgroup in it, as /proc/self/cgroup says
    controllers: frozenset[str]  # v1: those bound to it; v2: none until read from cgroup.controllers

    @property
    def server_dir(self) -> Path:
        return self.mount / self.path.lstrip("/")


def hierarchies(proc_cgroup: str, mountinfo: str) -> list[Hierarchy]:
    """The cgroup hierarchies holding this process, where they are mounted (pure).

    `proc_cgroup`: /proc/self/cgroup ("4:memory:/a/b", "0::/a" for v2); `mountinfo`:
    /proc/self/mountinfo. A mount of a sub-tree (a container's `root` field) is accounted for."""
    paths: dict[str, str] = {}  # controller (or "" for v2) -> path
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                paths[name] = parts[2]
    found: list[Hierarchy] = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3 or after[0] not in ("cgroup", "cgroup2"):
            continue
        root, mount = fields[3], Path(fields[4])
        if after[0] == "cgroup2":
            own = paths.get("")
            version: Literal[1, 2] = 2
            controllers: frozenset[str] = frozenset()
        else:
            bound = frozenset(o for o in after[2].split(",") if o in CONTROLLERS)
            own = next((paths[c] for c in bound if c in paths), None)
            version, controllers = 1, bound
        if own is None or (version == 1 and not controllers):
            continue
        if root != "/" and (own == root or own.startswith(root + "/")):
            own = own[len(root):] or "/"
        found.append(Hierarchy(version, mount, own, controllers))
    return found


@dataclass
class AgentGroup:
    """Where the agent's processes go: one directory per hierarchy used, and what is in force."""

    dirs: list[Path] = field(default_factory=list)
    in_force: dict[str, str] = field(default_factory=dict)  # controller -> how ("cgroup v1 pids.max=512")

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    @classmethod
    def create(cls, pids_max: int, memory_max: int, proc: Path = Path("/proc/self"),
               sweep: bool = True) -> AgentGroup:
        """Make the group with these limits, in whatever hierarchies allow it (none: an empty
        group, and the launcher's rlimits and nice are all there is). Blocking; root only."""
        try:
            found = hierarchies((proc / "cgroup").read_text(), (proc / "mountinfo").read_text())
        except OSError:
            return cls()
        group = cls()
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        wanted = dict.fromkeys(CONTROLLERS)  # controllers not yet placed, in order
        for h in sorted(found, key=lambda h: -h.version):  # v2 first
            controllers = [c for c in wanted if c in (_v2_controllers(h) if h.version == 2 else h.controllers)]
            if not controllers:
                continue
            if sweep:
                sweep_stale(h.server_dir)
            try:
                placed = group._make(h, name, controllers, pids_max, memory_max)
            except OSError as exc:
                log.warning("agent_cgroup_unavailable", hierarchy=str(h.mount), version=h.version,
                            error=exc.strerror or str(exc))
                continue
            for c in placed:
                wanted.pop(c, None)
        return group

    def _make(self, h: Hierarchy, name: str, controllers: list[str], pids_max: int, memory_max: int) -> list[str]:
        if h.version == 2:
            _enable_v2(h.server_dir, controllers)
        directory = h.server_dir / name
        directory.mkdir(mode=0o755)
        self.dirs.append(directory)
        version = f"cgroup v{h.version}"
        placed = []
        for c in controllers:
            if c == "pids":
                _write(directory / "pids.max", str(pids_max))
                self.in_force[c] = f"{version} pids.max={pids_max}"
            elif c == "memory":
                limit = "memory.max" if h.version == 2 else "memory.limit_in_bytes"
                _write(directory / limit, str(memory_max))
                swap = directory / ("memory.swap.max" if h.version == 2 else "memory.memsw.limit_in_bytes")
                with contextlib.suppress(OSError):  # no swap accounting: swap is not the agent's way round
                    _write(swap, "0" if h.version == 2 else str(memory_max))
                self.in_force[c] = f"{version} {limit}={memory_max}"
            elif c == "cpu":
                if h.version == 2:
                    _write(directory / "cpu.weight", str(CPU_WEIGHT_V2))
                    self.in_force[c] = f"{version} cpu.weight={CPU_WEIGHT_V2} (the server's: 100)"
                else:
                    _write(directory / "cpu.shares", str(CPU_SHARES_V1))
                    self.in_force[c] = f"{version} cpu.shares={CPU_SHARES_V1} (the server's: 1024)"
            placed.append(c)
        return placed

    def remove(self) -> None:
        """End what is left in the group and remove it. Blocking; idempotent."""
        for directory in self.dirs:
            _remove(directory)
        self.dirs.clear()


def sweep_stale(parent: Path, of: int | None = None) -> None:
    """Remove the groups of servers that are gone (killed before their stop removed them), or,
    with `of`, every group a process of that pid made."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and (int(match.group(1)) == of if of is not None else not _alive(int(match.group(1)))):
            _remove(entry)


def remove_groups_of(pid: int, proc: Path = Path("/proc/self")) -> None:
    """Every agent group this process (`pid`) made and left: a test run's end. Blocking."""
    try:
        found = hierarchies((proc / "cgroup").read_text(), (proc / "mountinfo").read_text())
    except OSError:
        return
    for h in found:
        sweep_stale(h.server_dir, of=pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _v2_controllers(h: Hierarchy) -> frozenset[str]:
    try:
        return frozenset((h.server_dir / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()


def _enable_v2(parent: Path, controllers: list[str]) -> None:
    """Let the server's cgroup give its children these controllers. v2 allows it only for a cgroup
    with no processes of its own (but the root): when the server is alone in its cgroup (a service
    of its own), it moves into a leaf beside the agent's, as a delegated service does."""
    control = parent / "cgroup.subtree_control"
    enabled = set(control.read_text().split())
    if set(controllers) <= enabled:
        return
    change = " ".join(f"+{c}" for c in controllers)
    try:
        _write(control, change)
    except OSError:
        procs = set((parent / "cgroup.procs").read_text().split())
        if procs != {str(os.getpid())}:
            raise
        leaf = parent / "sprite-os-server"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        _write(control, change)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:  # one write(2): cgroup files take a value per write
        f.write(value)


def _remove(directory: Path) -> None:
    for _ in range(50):
        try:
            pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        except OSError:
            return  # gone already
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            directory.rmdir()
            return
        except OSError:
            time.sleep(0.02)  # the killed are still leaving
    log.warning("agent_cgroup_left", path=str(directory))
