"""The person's files, as the console reaches them: list a folder, read a file, take in an upload.

Only user space: everything under the workspace root but `.os/`. The server may run as root
(user isolation) while the agent's user owns user space and can change it at any moment: swap a
folder for a symlink to `/etc` or to `.os/`, plant a symlink where an upload will land. So nothing
here goes by path. Each operation opens the root, then each folder of the path relative to the
one before with O_NOFOLLOW (a symlink anywhere fails the walk: ELOOP, or ENOTDIR for a file), and
opens the file itself the same way (O_NONBLOCK too: a FIFO must not hang a read), checking what
it opened with fstat. An upload is written to a folder of Sprite OS's own (`.os/state/uploads`,
root's, 0700) that the agent cannot touch, then linked into `documents/` under a name no file has
yet (link() never replaces one), relative to a descriptor of `documents/` opened the same way, and
given to whoever owns `documents/` (the agent's user, in user isolation). Across file systems it is
copied to a temp name in `documents/` first, synced, then linked the same way: a name never holds a
partial file.

Blocking I/O: the console's file API runs these in a thread.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..fsutil import NotDurable, make_dir
from ..logs import get_logger
from ..paths import Layout

UPLOAD_DIR = "documents"  # the design's place for a person's raw uploads
SYSTEM_DIR = ".os"
MAX_PATH = 4096
MAX_NAME_BYTES = 255
MAX_ENTRIES = 2_000  # listed per folder; more are counted, not listed

log = get_logger(__name__)


class PathRefused(Exception):
    """The path leads outside user space: `..`, absolute, into `.os/`, through a symlink, not a file."""


class NotThere(Exception):
    """Nothing by that name (or the folder it names is gone)."""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # file | folder | link | other (a link is shown, never followed)
    size: int
    modified: float
    openable: bool = True  # False: the name is not valid UTF-8; `name` shows it with U+FFFD for each bad byte


def _shown(name: str) -> tuple[str, bool]:
    """A name as the wire can carry it, and whether it can be asked for by that name. Names are
    bytes on Linux: one that is not UTF-8 (os.scandir keeps its bytes as surrogates, which no JSON
    encoder takes) is shown with U+FFFD in place of each bad byte, and can't be opened by it."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return os.fsencode(name).decode(errors="replace"), False
    return name, True


def _order(name: str, folder: bool) -> tuple[bool, str, str]:
    """Where an entry goes in a listing: folders first, then by name (case aside, then as written)."""
    return not folder, name.casefold(), name


def parts(path: str) -> list[str]:
    """The folders and name of a path relative to the workspace root, or PathRefused.

    "" is the root. No empty, `.` or `..` part, no NUL, no absolute path, and never `.os`."""
    if len(path) > MAX_PATH or "\0" in path or path.startswith("/"):
        raise PathRefused("paths are relative to your files, without NUL")
    found = [p for p in path.split("/") if p != ""] if path else []
    if path and not found:
        raise PathRefused("an empty path")
    for part in found:
        if part in (".", ".."):
            raise PathRefused("a path may not contain . or ..")
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise PathRefused("a name in the path is too long")
    if found and found[0] == SYSTEM_DIR:
        raise PathRefused(".os/ is Sprite OS's own: it is not among your files")
    return found


_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\]")


def upload_name(name: str) -> str:
    """A file name for an upload: the last part of what the browser sent, without control, format
    (bidi overrides such as U+202E, which can make `gnp.exe` read as `exe.png`) or path characters,
    and not hidden. PathRefused if nothing usable is left."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in unicodedata.normalize("NFC", base) if unicodedata.category(c) != "Cf")
    base = _UNSAFE.sub("_", base).strip().lstrip(".").strip()
    if not base:
        raise PathRefused("the file needs a name")
    while len(base.encode()) > MAX_NAME_BYTES - 16:  # room for " (999)" and the extension
        stem, dot, ext = base.rpartition(".")
        base = f"{stem[:-1]}{dot}{ext}" if dot and stem else base[:-1]
    return base


def numbered(name: str) -> Iterator[str]:
    """name, then "name (2).ext", "name (3).ext" ...: an upload never replaces a file."""
    yield name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, dot, ext = name, "", ""
    for n in range(2, 1000):
        yield f"{stem} ({n}){dot}{ext}"


class UserFiles:
    """User space under `layout.root`, and the folder uploads wait in until they are whole."""

    def __init__(self, layout: Layout) -> None:
        self.root = layout.root
        self.incoming = layout.state_dir / "uploads"

    # ------------------------------------------------------------ walking without following

    @contextlib.contextmanager
    def folder(self, path: list[str], create_last: bool = False) -> Iterator[int]:
        """A descriptor of the folder `path` (parts), opened a part at a time, never through a link."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for n, part in enumerate(path):
                try:
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except FileNotFoundError:
                    if not (create_last and n == len(path) - 1):
                        raise NotThere(f"no folder {'/'.join(path[:n + 1])}") from None
                    make_dir(part, fd, 0o700)  # its name survives a power loss; opened below without following, then given
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    _give_like(nfd, fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise PathRefused(f"{'/'.join(path[:n + 1])} is a link or not a folder: "
                                          "Sprite OS does not follow links out of your files") from None
                    raise
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            os.close(fd)

    def listing(self, path: str, offset: int = 0, after: tuple[str, bool] | None = None) -> tuple[list[Entry], int, int]:
        """The folder's entries from `offset` in its order (folders first, then by name), or just after
        `after` (a name, and whether it is a folder's: the last entry of the page before), at most
        MAX_ENTRIES of them, how many there are in all, and how many come after those listed. The whole
        folder is put in order first (its names and whether each is a folder, which the directory itself
        says), and only the entries listed are looked at: a listing of a folder past the limit is the next
        page of one order, not whichever entries the disk gave first. A page asked after an entry goes on
        from where the one before it ended even when the folder changed between them (an entry removed
        above would otherwise shift the next one past the offset, and it was never listed)."""
        found = parts(path)
        with self.folder(found) as fd:
            with os.scandir(fd) as it:
                items = [item for item in it if found or item.name != SYSTEM_DIR]
            named = sorted(((_order(_shown(item.name)[0], item.is_dir(follow_symlinks=False)), item) for item in items),
                           key=lambda pair: pair[0])
            if after is not None:
                offset = bisect.bisect_right(named, _order(*after), key=lambda pair: pair[0])
            entries: list[Entry] = []
            for _, item in named[offset:offset + MAX_ENTRIES]:
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                name, openable = _shown(item.name)
                entries.append(Entry(name, _kind(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0,
                                     st.st_mtime, openable))
        return entries, len(items), max(0, len(named) - offset - MAX_ENTRIES)

    @contextlib.contextmanager
    def open_file(self, path: str) -> Iterator[tuple[int, os.stat_result]]:
        """A read descriptor of a regular file in user space, and its stat."""
        fd, st = self.open_held(path)
        try:
            yield fd, st
        finally:
            os.close(fd)

    def open_held(self, path: str) -> tuple[int, os.stat_result]:
        """A read descriptor of a regular file in user space, and its stat: the caller closes it."""
        found = parts(path)
        if not found:
            raise PathRefused("that is your files' folder, not a file")
        with self.folder(found[:-1]) as dir_fd:
            try:
                fd = os.open(found[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                raise NotThere(f"no file {path}") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathRefused(f"{path} is a link: Sprite OS does not follow links out of your files") from None
                if exc.errno == errno.ENXIO:  # a Unix socket (or a device with nothing behind it)
                    raise PathRefused(f"{path} is not a file (a socket)") from None
                if exc.errno in (errno.EACCES, errno.EPERM):
                    raise PathRefused(f"{path} can't be read: Sprite OS is not allowed to") from None
                raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PathRefused(f"{path} is not a file ({_kind(st.st_mode)})")
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def read(self, path: str, offset: int, length: int) -> tuple[bytes, int]:
        """`length` bytes of a file from `offset`, and the file's size."""
        with self.open_file(path) as (fd, st):
            # Past the end: nothing (pread refuses an offset near 2**63 with EINVAL).
            return (os.pread(fd, length, offset) if offset < st.st_size else b""), st.st_size

    # ------------------------------------------------------------ uploads

    def begin_upload(self) -> tuple[str, int]:
        """A new, empty file in Sprite OS's own uploads folder: (its name, a write descriptor)."""
        self.incoming.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"{secrets.token_hex(8)}.part"
        fd = os.open(self.incoming / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        return name, fd

    def discard_upload(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.incoming / name)

    def sweep_uploads(self, older_than: float) -> int:
        """Remove uploads left unfinished (a server stopped mid-upload) older than `older_than`, and the
        temp copies in documents/ a cross-mount upload left (COPY_TEMP: a stop or kill mid-copy)."""
        removed = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.incoming):
                if entry.name.endswith(".part") and entry.stat(follow_symlinks=False).st_mtime < older_than:
                    self.discard_upload(entry.name)
                    removed += 1
        with contextlib.suppress(NotThere, PathRefused, FileNotFoundError), self.folder([UPLOAD_DIR]) as docs:
            for name in os.listdir(docs):
                if not COPY_TEMP.fullmatch(name):
                    continue
                try:  # documents/ is the agent's and the person's: only a plain file of the name is a copy
                    if stat.S_ISREG(os.stat(name, dir_fd=docs, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=docs)
                        removed += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:  # one that cannot go is left, never the start stopped
                    log.warning("upload_copy_not_swept", name=name, error=str(exc))
        return removed

    def finish_upload(self, name: str, fd: int, wanted: str) -> str:
        """Put the whole upload in documents/ under `wanted` (or "wanted (2)" ...), never replacing a
        file and never through a link, and give it to documents/' owner. Returns its path. Linked in
        from the uploads folder; across file systems (EXDEV), copied to a temp name in documents/,
        synced, then linked to the free name (so the name is never a partial file) and the temp
        removed. Placed: an error after that (giving it, the folder's fsync) raises Placed."""
        os.fsync(fd)
        with self.folder([UPLOAD_DIR], create_last=True) as docs, \
                _directory(self.incoming) as incoming:
            try:
                placed = _link_free(name, incoming, docs, wanted)
                given = fd
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=incoming)
                try:
                    placed, given = _copy_into(source, docs, wanted), -1
                finally:
                    os.close(source)
            path = f"{UPLOAD_DIR}/{placed}"
            try:
                if given >= 0:
                    _give_like(given, docs)
                os.fsync(docs)
            except OSError as exc:
                raise Placed(path, exc) from exc
        self.discard_upload(name)
        return path


class Placed(NotDurable):
    """The upload is in documents/ at `path`, whole; a step after (giving it to documents/' owner, the
    folder's fsync) failed: written, not confirmed, as NotDurable says (answered `not_durable`)."""

    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror)
        self.path = path


# A cross-mount upload's copy in documents/ until it is whole and synced: swept at start.
COPY_TEMP = re.compile(r"\.sprite-upload-[0-9a-f]{16}\.tmp")


def _link_free(name: str, src_dir: int, docs: int, wanted: str) -> str:
    """Link `name` (in `src_dir`) into documents/ under the first free numbered name; that name."""
    for candidate in numbered(wanted):
        try:
            os.link(name, candidate, src_dir_fd=src_dir, dst_dir_fd=docs, follow_symlinks=False)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"documents/ already has {wanted} and 998 numbered copies")


@contextlib.contextmanager
def _directory(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _copy_into(src: int, docs: int, wanted: str) -> str:
    """Across file systems (no link from the uploads folder): copy to a temp name in documents/, sync
    it, give it, and link it to the first free numbered name. The temp is removed whatever happens:
    nothing is left under the person's name unless it is whole. Returns the name."""
    temp = f".sprite-upload-{secrets.token_hex(8)}.tmp"
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=docs)
    try:
        try:
            offset, size = 0, os.fstat(src).st_size
            while offset < size:
                offset += os.sendfile(out, src, offset, size - offset)
            os.fsync(out)
            _give_like(out, docs)
        finally:
            os.close(out)
        return _link_free(temp, docs, docs, wanted)
    finally:
        with contextlib.suppress(OSError):  # left: swept at the next start
            os.unlink(temp, dir_fd=docs)


def _give_like(fd: int, folder_fd: int) -> None:
    """Make what `fd` opened belong to its folder's owner and group (a server running as root writes
    for the agent's user, who owns user space), writable by them: a file 0664, a folder 0775."""
    folder, st = os.fstat(folder_fd), os.fstat(fd)
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (folder.st_uid, folder.st_gid):
        os.fchown(fd, folder.st_uid, folder.st_gid)
    os.fchmod(fd, 0o775 if stat.S_ISDIR(st.st_mode) else 0o664)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"

