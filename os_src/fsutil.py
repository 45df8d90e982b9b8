"""Files: crash-safe writes (a reader sees the old content or the new, never a torn file),
and the advisory lock that gives a workspace's memory exactly one writer."""

from __future__ import annotations

import fcntl
import os
from typing import Any

from .deploy_contract import atomic_write as atomic_write  # shared with bootstrap/deploy.py
from .errors import LockHeld


class WriterLock:
    """A non-blocking flock on one file, held for as long as the holder runs (the server), or for
    one operation (`with WriterLock(path):` in `memory rebuild` and `migrate-v1`)."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(f"another process is curating this workspace's memory (lock: {self.path})") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, *_: Any) -> None:
        self.release()
