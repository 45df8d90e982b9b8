"""Faults from outside the server, as an operator or the machine makes them: an `sqlite3` shell
holding an exclusive lock, a small file system that fills up. Tests and the chaos suite share them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sprite_os.errors import SpriteOSError


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
