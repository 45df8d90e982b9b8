"""Files: crash-safe writes (a reader sees the old content or the new, never a torn file),
and the advisory lock that gives a workspace's memory exactly one writer.

The durability primitives (NotDurable, sync_dir, make_dir, make_dirs, synced_after_rename) live with
the atomic write in the deploy contract, which says why; the product takes them from here."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from .deploy_contract import NotDurable as NotDurable
from .deploy_contract import atomic_write as atomic_write  # bootstrap/deploy.py's too
from .deploy_contract import make_dir as make_dir
from .deploy_contract import make_dirs as make_dirs
from .deploy_contract import sync_dir as sync_dir
from .deploy_contract import synced_after_rename as synced_after_rename
from .errors import LockHeld, SpriteOSError
from .procfs import alive


class StillHeld(Exception):
    """held()'s lock was still held by another when its wait ran out (not an OSError: the block's own are not it)."""


@contextlib.contextmanager
def held(path: os.PathLike[str] | str, within: float | None = None) -> Iterator[None]:
    """A blocking flock on `path` for the block's length: writers of one thing that may race (two
    processes allocating a version number, two commands writing or removing the pid file). With
    `within`, StillHeld if it is still held after that many seconds (a holder stopped by Ctrl-Z
    holds it for as long as it stays stopped)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if within is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + within
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StillHeld(f"{path} held for {within:.0f}s") from None
                    time.sleep(0.05)
        yield
    finally:
        os.close(fd)


class Holder(NamedTuple):
    """Who holds a WriterLock, as it wrote itself down in the lock file. `role` None: it named nobody (an
    earlier version's holder, a write the disk refused, the moment between its flock and its note, or a note
    a killed holder left: release() clears the note, a kill does not); `pid` then the one /proc/locks shows,
    None where it shows none."""

    pid: int | None
    role: str | None

    def describe(self) -> str:
        """Who it is, in the words every command uses: "the server (pid 12)", "`sprite-os memory import` (pid 12)"."""
        if self.role is None:
            return "a process that did not say what it is" + (f" (pid {self.pid})" if self.pid is not None else "")
        return f"the server (pid {self.pid})" if self.role == WriterLock.SERVER else f"`sprite-os {self.role}` (pid {self.pid})"


# acquire()'s tries at a held lock, LOCK_TRY seconds apart: about 1 s.
LOCK_TRIES = 50
LOCK_TRY = 0.02


class WriterLock:
    """A non-blocking flock on one file, held for as long as the holder runs (the server), or for
    one operation (`memory rebuild`, `memory import` when no server runs, `migrate-v1`). The holder
    writes "<pid> <role>" into the file once it holds it (SERVER, IMPORT, REBUILD, MIGRATE, ROLLBACK), so
    that a process that finds the lock held can tell who has it (`holder()`): a `memory import` waits for
    another import, but not for a rebuild, which takes no imports."""

    SERVER, IMPORT, REBUILD, MIGRATE = "server", "memory import", "memory rebuild", "migrate-v1"
    ROLLBACK = "memory rollback"

    def __init__(self, path: os.PathLike[str] | str, role: str) -> None:
        self.path = path
        self.role = role
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait: bool = True) -> None:
        """Take the lock and write its note; taking it again changes nothing. Held by another process, it is
        tried again for about a second (LOCK_TRIES, LOCK_TRY apart; once only with `wait` False): a waiting
        `memory import` takes it for an instant to see whether it is free (nobody_holds, when /proc/locks shows
        no holder), and a taker that lands in that instant is not refused. Still held: LockHeld, naming the holder."""
        if self._fd is not None:
            return
        try:
            fd = self._take(LOCK_TRIES if wait else 1)
        except LockHeld as exc:
            raise LockHeld(f"{exc}, held by {(self.holder() or Holder(None, None)).describe()}") from None
        with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, its holder unnamed
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {self.role}\n".encode(), 0)

    def _take(self, tries: int = 1) -> int:
        """The flock, tried `tries` times LOCK_TRY apart; LockHeld if the last try finds it held. A lock file
        this user cannot open (another user's, a read-only disk) is one line too (SpriteOSError), not a traceback."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SpriteOSError(f"cannot open the workspace's writer lock {self.path}: {exc.strerror or exc}") from None
        for left in range(tries - 1, -1, -1):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not left:
                    os.close(fd)
                    raise LockHeld(f"another process holds this workspace (a running server, or a memory command): lock {self.path}") from None
            time.sleep(LOCK_TRY)
        self._fd = fd
        return fd

    def release(self) -> None:
        """Let go; the note is cleared first, while still held, so that it never names a holder that is gone."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None

    def nobody_holds(self) -> bool:
        """Whether nobody holds the lock now (False: another process, or this one), made sure of by taking
        it for a moment (no note written) when /proc/locks shows no holder (unreadable there, or an overlay's
        device numbers, which differ from what it shows): only for a command that means to take it anyway."""
        if self._fd is not None:  # this one holds it
            return False
        if self._flocked_by() is not None:  # while a holder runs it is never taken, not even for a moment
            return False
        try:
            self._take()
        except LockHeld:
            return False
        self.release()
        return True

    def _flocked_by(self) -> int | None:
        """The pid /proc/locks shows holding a flock on the file; None when it shows none, or is unreadable."""
        try:
            st = os.stat(self.path)
            mine = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
            with open("/proc/locks") as f:
                for line in f:  # "1: FLOCK  ADVISORY  WRITE <pid> <major:minor:inode> 0 EOF"
                    fields = line.split()
                    if "FLOCK" in fields and mine in fields and (at := fields.index(mine)) > 0:
                        return int(fields[at - 1]) if fields[at - 1].isdigit() else None
        except (OSError, ValueError):
            pass
        return None

    def _note(self) -> Holder:
        """The lock file's note, if the process it names is alive; Holder(None, None) if not."""
        try:
            pid, _, role = Path(self.path).read_text(errors="replace").strip().partition(" ")
        except OSError:
            pid = role = ""
        return Holder(int(pid), role) if pid.isdigit() and role and alive(int(pid)) else Holder(None, None)

    def holder(self) -> Holder | None:
        """Who holds the lock now, without taking it even for a moment or writing anything, so that a
        read-only look (`memory status`) never stands in a holder's way: the process /proc/locks shows holding
        the flock, named by the note if the note is its own (role None: it named nobody yet, or could not);
        where /proc/locks shows none (unreadable, an overlay's device numbers), the note's process if alive.
        None when nobody does, as far as these tell."""
        note = self._note()
        if (pid := self._flocked_by()) is not None:
            return note if note.pid == pid else Holder(pid, None)
        return note if note.pid is not None else None

    def holder_checked(self) -> Holder | None:
        """holder(), made sure of by taking the lock for a moment when nothing shows a holder (nobody_holds()): for a
        command that means to take the lock anyway (`memory import`), never for a read-only look."""
        if self.nobody_holds():
            return None
        return self.holder() or Holder(None, None)

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, *_: Any) -> None:
        self.release()


def shown_name(name: str) -> str:
    """A file name as text every encoder and terminal takes: a byte that is no UTF-8 (read by Python as a lone
    surrogate, which a JSON frame's encoder refuses) and a control character (an escape sequence, a newline) are
    escaped (\\xNN, \\uNNNN), the rest as it is. For saying a name only: the file is found by the name itself."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def free_bytes(path: os.PathLike[str] | str) -> int:
    """The bytes a process that is not root may still write on the filesystem holding `path`
    (statvfs's f_bavail: root's reserve is not counted). Raises OSError; each caller says what
    an unreadable disk means to it."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class TornAppend(OSError):
    """An append failed, and so did cutting the file back: its tail is a torn line."""


def append_whole(fd: int, data: bytes, size: int, sync: Callable[[int], None] | None) -> None:
    """Append `data` to the file open on `fd` (O_APPEND, no buffer), whose first `size` bytes are
    all it held, then `sync(fd)` unless it is None. A failure (a short write, then a full disk;
    EIO) cuts the file back to `size`, so that a torn line never runs into the next one, and
    raises; TornAppend (the same errno) when that cut failed too."""
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        if sync is not None:
            sync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, size)
        except OSError:
            raise TornAppend(exc.errno, exc.strerror) from exc
        raise


def temp_name(tag: str = "") -> re.Pattern[str]:
    """The name of atomic_write's temp file given `tag`: `.<name>.<tag><8 random characters>.tmp` beside the file
    it replaces (mkstemp's characters), `name` its group."""
    return re.compile(rf"^\.(?P<name>.+)\.{re.escape(tag)}[a-z0-9_]{{8}}\.tmp$")


_TEMP = temp_name()


def sweep_files(directory: Path, doomed: Callable[[os.DirEntry[str]], object]) -> list[Path]:
    """Remove the regular files in `directory` that `doomed(entry)` picks. One it cannot look at or remove
    (gone already, a removal refused) stays, unraised: tidying never stops the work that called it.
    Returns what it removed."""
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and doomed(entry):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def temp_for(name: str) -> str | None:
    """The name of the file whose `atomic_write` temp file is named `name`, or None if it is none."""
    return match["name"] if (match := _TEMP.match(name)) else None


def sweep_temp_files(directory: Path, owned: Callable[[str], object], *, written_since: float | None = None) -> list[Path]:
    """Remove what an interrupted `atomic_write` left in `directory` (a kill -9 between its temp
    file and its rename): the temp files of the names `owned(name)` accepts, nothing else; with
    `written_since` (a time), only those last written then or later (in a folder another program wrote
    before, that program's older ones stay). Call it only while holding the lock that makes this process
    those files' one writer. Returns what it removed."""
    def doomed(entry: os.DirEntry[str]) -> bool:
        name = temp_for(entry.name)
        return bool(name is not None and owned(name) and (
            written_since is None or entry.stat(follow_symlinks=False).st_mtime >= written_since))

    return sweep_files(directory, doomed)
