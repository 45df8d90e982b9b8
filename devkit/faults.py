"""Faults from outside the server, as an operator or the machine makes them: an `sqlite3` shell
holding an exclusive lock, a small file system that fills up, a disk that loses what was not
fsynced when the power goes (devkit/lazyfs.py) or is slow to fsync, an ext4 file system remounted
read-only by an I/O error. Tests and the chaos suite share them."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sprite_os.errors import SpriteOSError

from .processes import kit_env


class FaultSetupFailed(SpriteOSError):
    """A fault could not be put in place (no sqlite3 shell, no permission to mount)."""


@contextlib.asynccontextmanager
async def exclusive_lock(db: Path) -> AsyncIterator[None]:
    """What an operator's `sqlite3 DB 'BEGIN EXCLUSIVE;'` does, held until the block ends."""
    proc = await asyncio.create_subprocess_exec(
        "sqlite3", str(db), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b".timeout 10000\nBEGIN EXCLUSIVE;\nSELECT 'locked';\n")
    await proc.stdin.drain()
    if (await asyncio.wait_for(proc.stdout.readline(), 15)).strip() != b"locked":
        proc.kill()
        await proc.wait()
        raise FaultSetupFailed(f"sqlite3 could not lock {db}")
    try:
        yield
    finally:
        proc.stdin.write(b"COMMIT;\n.quit\n")
        await proc.stdin.drain()
        await asyncio.wait_for(proc.wait(), 15)


class FsyncSpy:
    """os.fsync as a disk with bad sectors under given folders or files: put in place with
    `monkeypatch.setattr(os, "fsync", spy)`. Each fsync'd path is recorded in `synced`; a path in
    `failing` gets EIO once (then leaves the set), as a disk that reports a write it lost."""

    def __init__(self) -> None:
        self.synced: list[Path] = []
        self.failing: set[Path] = set()
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path in self.failing:
            self.failing.discard(path)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._real(fd)
        self.synced.append(path)


def tmpfs_refusal() -> str | None:
    """Why a tmpfs cannot be mounted here, or None if it can be tried."""
    return "needs root for mount -t tmpfs" if os.geteuid() != 0 else None


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "48m") -> Iterator[Path]:
    """`path` as a fresh tmpfs of `size`, unmounted at the end; FaultSetupFailed where mounting
    is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    if (why := tmpfs_refusal()) is not None:
        raise FaultSetupFailed(why)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        raise FaultSetupFailed(f"mount -t tmpfs failed: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Fill the file system `path` is on, to the last block; returns the filler file to delete."""
    filler = path / "filler"
    # Unbuffered: a write the disk refused must not wait in a buffer for close() to fail on it again.
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    with contextlib.suppress(OSError), filler.open("ab", buffering=0) as f:
        while True:
            f.write(b"\0" * 512)
    return filler


# ---------------------------------------------------------------- a disk that loses unsynced writes


def fuse_refusal() -> str | None:
    """Why devkit/lazyfs.py cannot be mounted here, or None if it can be tried."""
    if os.geteuid() != 0:
        return "needs root to mount a FUSE file system"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return "pyfuse3 is not installed (the test extra; it builds against libfuse3-dev)"
    return None


class LazyDisk:
    """devkit/lazyfs.py mounted at `root/mount` over `root/backing`: data written without an
    fsync stays in that process's memory until `power_off()` drops it; `power_on()` mounts
    the backing directory again, as the disk came back. `fsync_delay`: a slow disk."""

    def __init__(self, root: Path, fsync_delay: float = 0.0) -> None:
        self.backing = root / "backing"
        self.mount = root / "mount"
        self.fsync_delay = fsync_delay
        self._stats = root / "lazyfs-stats.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.power_cuts = 0

    def power_on(self) -> Path:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devkit.lazyfs", str(self.backing), str(self.mount),
             "--fsync-delay", str(self.fsync_delay), "--stats", str(self._stats)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=kit_env())
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            error = self.proc.communicate(timeout=10)[1].decode(errors="replace")
            raise FaultSetupFailed(f"lazyfs did not mount: {error.strip()[-500:]}")
        return self.mount

    def stats(self) -> dict[str, int]:
        """The file system's counts (fsyncs, bytes written, synced, still unsynced)."""
        assert self.proc is not None
        before = self._stats.stat().st_mtime_ns if self._stats.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self._stats.exists() or self._stats.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise TimeoutError("lazyfs wrote no counts")
            time.sleep(0.01)
        counts: dict[str, int] = json.loads(self._stats.read_text())
        return counts

    def power_off(self) -> None:
        """Every unsynced write is gone: the file system's process is killed, the mount cleared.
        Stop what writes to it first, as a power cut stops everything at once."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.power_cuts += 1
        _unmount(self.mount)

    def unmount(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        _unmount(self.mount)


def _unmount(path: Path) -> None:
    if os.path.ismount(path) or _mounted(path):
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def _mounted(path: Path) -> bool:
    """In /proc/self/mounts (a FUSE mount whose process died fails os.path.ismount's stat)."""
    return any(line.split()[1] == str(path) for line in Path("/proc/self/mounts").read_text().splitlines())


@contextlib.contextmanager
def lazy_disk(root: Path, fsync_delay: float = 0.0) -> Iterator[LazyDisk]:
    """A mounted LazyDisk under `root`, unmounted at the end; FaultSetupFailed where FUSE can't be
    mounted."""
    if (why := fuse_refusal()) is not None:
        raise FaultSetupFailed(why)
    disk = LazyDisk(root, fsync_delay)
    disk.power_on()
    try:
        yield disk
    finally:
        disk.unmount()


# ---------------------------------------------------------------- an ext4 file system that fails


def loop_refusal() -> str | None:
    """Why an ext4 image cannot be mounted on a loop device here, or None if it can be tried."""
    if os.geteuid() != 0:
        return "needs root to mount an ext4 image on a loop device"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control)"
    missing = [tool for tool in ("mkfs.ext4", "e2fsck", "findmnt") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (e2fsprogs, util-linux)" if missing else None


class LoopExt4:
    """An ext4 image on a loop device, mounted `errors=remount-ro` as a real workspace disk would
    be, whose next error an operator can force (`trigger_error`): the kernel then remounts it
    read-only, and what was not yet committed to its journal is gone. `repair()` is the
    operator's fsck and remount."""

    def __init__(self, root: Path, size: str = "256M") -> None:
        self.image = root / "ext4.img"
        self.mount = root / "mount"
        self.size = size
        self.device = ""

    def create(self) -> Path:
        self.mount.mkdir(parents=True, exist_ok=True)
        subprocess.run(["truncate", "-s", self.size, str(self.image)], check=True)
        _run(["mkfs.ext4", "-q", "-F", str(self.image)])
        return self.mount_it()

    def mount_it(self) -> Path:
        _run(["mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mount)])
        self.device = _run(["findmnt", "-n", "-o", "SOURCE", str(self.mount)]).strip()
        return self.mount

    def trigger_error(self) -> None:
        """What a failing disk does to ext4: an error, and (errors=remount-ro) a read-only remount."""
        Path(f"/sys/fs/ext4/{Path(self.device).name}/trigger_fs_error").write_text("chaos\n")

    @property
    def read_only(self) -> bool:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if fields[1] == str(self.mount):  # recent kernels say emergency_ro, and keep rw
                return bool({"ro", "emergency_ro"} & set(fields[3].split(",")))
        return False

    def repair(self) -> int:
        """Unmount, `e2fsck -fy`, mount again; returns fsck's exit code (0 clean, 1 fixed). Nothing
        may hold the file system open."""
        self.unmount()
        fsck = subprocess.run(["e2fsck", "-fy", str(self.image)], capture_output=True, text=True)
        if fsck.returncode not in (0, 1):
            raise FaultSetupFailed(f"e2fsck exited {fsck.returncode}: {fsck.stdout[-500:]}")
        self.mount_it()
        return fsck.returncode

    def unmount(self) -> None:
        for _ in range(50):  # a process that held it may take a moment to go
            if not _mounted(self.mount):
                return
            if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode == 0:
                return
            time.sleep(0.2)
        raise FaultSetupFailed(f"{self.mount} stays busy")


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FaultSetupFailed(f"{cmd[0]} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout


@contextlib.contextmanager
def loop_ext4(root: Path, size: str = "256M") -> Iterator[LoopExt4]:
    """A fresh LoopExt4 under `root`, unmounted (its loop device freed) at the end;
    FaultSetupFailed where it can't be mounted."""
    if (why := loop_refusal()) is not None:
        raise FaultSetupFailed(why)
    disk = LoopExt4(root, size)
    disk.create()
    try:
        yield disk
    finally:
        with contextlib.suppress(FaultSetupFailed):
            disk.unmount()
        if _mounted(disk.mount):
            subprocess.run(["umount", "-l", str(disk.mount)], check=False, capture_output=True)
