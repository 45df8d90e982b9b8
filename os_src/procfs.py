"""What /proc says about processes: the few facts Sprite OS acts on, read one way.

Every reader tolerates a process that ends while it is read (it is then simply not there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat that matter here."""

    state: str  # R, S, D, T, Z (zombie), X (dead)...
    ppid: int
    pgid: int
    sid: int
    start_time: int  # clock ticks after boot: with the pid, names one process across pid reuse

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def stat(pid: int) -> Stat | None:
    """The process's stat, or None if there is no such process."""
    try:
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """`pid` is a running process (not a zombie)."""
    found = stat(pid)
    return found is not None and found.alive


def pids() -> Iterator[int]:
    """Every process's pid, as /proc lists them now."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def cmdline(pid: int) -> bytes:
    """The process's command line, NUL-separated; b"" if it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def exe(pid: int) -> str:
    """The program the process runs (its path); "" if it is gone or not ours to see."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def uid(pid: int) -> int | None:
    """The owner of /proc/<pid> (the process's effective uid, as the kernel shows it), or None."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def boot_id() -> str:
    """This boot's id: a pid recorded in an earlier boot names nothing now."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str] | None:
    """The environment the process started with; None if it is gone or not ours to see."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}
