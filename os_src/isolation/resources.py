"""What the agent's processes may take of the machine, as pure rules over facts read at start.

In `user` mode (isolation/launch.py), every process the agent's CLI starts is held to
- a number of processes (cgroup pids.max where the machine has the controller; RLIMIT_NPROC on
  the agent's dedicated user always), so a fork bomb ends at the limit;
- an amount of memory (cgroup memory.max / memory.limit_in_bytes): the machine's memory less a
  reserve for the server; the kernel ends the agent's largest process when it is reached;
- a CPU weight below the server's (cgroup cpu.weight / cpu.shares: all the agent's processes
  together weigh nine tenths of the server; `nice` always), so busy loops on every core leave the
  server its turn;
- private, size-bounded tmpfs mounts for /tmp, /var/tmp, /dev/shm and its home, `nosuid`: they go
  when the session's mount namespace does, nothing the agent leaves there is anyone else's to run,
  and they count against its memory, not the server's disk.
The server keeps the disk the agent would fill: the workspace's file system must keep root-reserved
blocks (ext2/3/4 keep 5% by default), which the server (root) may use and the agent's user may not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
MIN_SERVER_MEMORY = 512 * MIB  # what the machine keeps from the agent, at least (or an eighth of it)
AGENT_NICE = 10
MIN_DISK_RESERVE = 16 * MIB  # the root-reserved space that counts as a reserve for the server's writes


def default_memory(total: int) -> int:
    """The agent's memory limit on a machine of `total` bytes: all but a reserve for the server."""
    return max(total - max(MIN_SERVER_MEMORY, total // 8), total // 2)


def memory_total(meminfo: str) -> int | None:
    """MemTotal, in bytes, from /proc/meminfo's text."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


@dataclass(frozen=True)
class Mount:
    point: Path
    fstype: str
    options: frozenset[str]  # the super block's, with the mount's (resuid=, resgid=, ...)


def mount_of(path: Path, mountinfo: str) -> Mount | None:
    """The mount `path` (resolved) is on, from /proc/self/mountinfo's text: the longest mount point
    that holds it, the last mounted where two share one."""
    best: Mount | None = None
    target = str(path)
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 6 or len(after) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        if not (target == point or target.startswith(point.rstrip("/") + "/")):
            continue
        if best is None or len(point) >= len(str(best.point)):
            best = Mount(Path(point), after[0], frozenset(fields[5].split(",")) | frozenset(after[2].split(",")))
    return best


@dataclass(frozen=True)
class DiskReserve:
    reserved_bytes: int
    holds: bool  # the server can write there when the agent has filled the disk
    why: str


def disk_reserve(mount: Mount | None, block_size: int, free_blocks: int, available_blocks: int,
                 server_is_root: bool, agent_uid: int | None, agent_gid: int | None) -> DiskReserve:
    """Whether the workspace's file system keeps space the agent cannot take from the server:
    root-reserved blocks (free to root, not to an unprivileged user), enough of them, and no
    `resuid`/`resgid` mount option that hands them to the agent's user or group."""
    reserved = max(0, free_blocks - available_blocks) * block_size
    fstype = mount.fstype if mount else "unknown"
    if not server_is_root:
        return DiskReserve(reserved, False, "the server is not root: root-reserved blocks are not its")
    if reserved < MIN_DISK_RESERVE:
        return DiskReserve(reserved, False, f"{fstype} keeps {reserved // MIB} MiB reserved for root (less than "
                                            f"{MIN_DISK_RESERVE // MIB} MiB): the agent can fill the disk the "
                                            "server writes to")
    options = mount.options if mount else frozenset()
    given = {f"resuid={agent_uid}", f"resgid={agent_gid}"} & options
    if given:
        return DiskReserve(reserved, False, f"the mount gives the reserved blocks to the agent ({', '.join(sorted(given))})")
    return DiskReserve(reserved, True, f"{fstype} root-reserved blocks: {reserved // MIB} MiB the agent's user "
                                       "cannot use")
