"""A file system that loses what was not fsynced when the power goes (the idea of Jepsen's
LazyFS), for the chaos suite and its smoke test: exact and repeatable where a real power cut
is neither.

    python -m devkit.lazyfs BACKING MOUNTPOINT [--fsync-delay S] [--stats FILE]

It mirrors BACKING at MOUNTPOINT (FUSE, pyfuse3). A file's data written since its last fsync
(or fdatasync) lives only in this process's memory, in whole pages over the backing file;
an fsync writes them through. Everything else goes straight to BACKING, durable at once:
creating, renaming, linking and removing files, directories, modes, owners and sizes set by
truncate (as a journaling file system's metadata is, near enough). So "power off" is one
SIGKILL of this process (devkit/faults.py `LazyDisk.power_off`): the backing directory is
then the disk as it comes back, with every unsynced write gone and every synced one there.

`--fsync-delay S` holds each fsync (of a file or a directory) for S seconds before it
returns: a slow cloud or SD disk. Each fsync waits on its own; other requests go on.
On SIGUSR1 it writes its counts (fsyncs, bytes written, bytes still unsynced) to `--stats`
as JSON. It prints `ready` once mounted, and unmounts on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import stat as stat_m
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from os import fsdecode, fsencode
from pathlib import Path
from typing import Any, TypeVar

import pyfuse3
import trio
from pyfuse3 import (
    EntryAttributes,
    FileHandleT,
    FileInfo,
    FUSEError,
    InodeT,
    ReaddirToken,
    RequestContext,
    SetattrFields,
    StatvfsData,
)

PAGE = 4096
T = TypeVar("T")


def _os(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """An OS call on the backing directory, its error passed on to the caller as FUSE's."""
    try:
        return call(*args, **kwargs)
    except OSError as exc:
        raise FUSEError(exc.errno or errno.EIO) from None


@dataclass
class Unsynced:
    """One file's writes since its last fsync: whole pages over the backing file, and the size
    its writers see. `fd` is its own descriptor on the backing file, so the inode (and its
    number) lives while pages wait, even once the last name is gone."""

    fd: int
    size: int
    pages: dict[int, bytearray] = field(default_factory=dict)

    def page(self, index: int) -> bytearray:
        found = self.pages.get(index)
        if found is None:
            found = bytearray(os.pread(self.fd, PAGE, index * PAGE).ljust(PAGE, b"\0"))
            self.pages[index] = found
        return found

    def write(self, offset: int, data: bytes) -> None:
        done = 0
        while done < len(data):
            index, at = divmod(offset + done, PAGE)
            n = min(PAGE - at, len(data) - done)
            self.page(index)[at:at + n] = data[done:done + n]
            done += n
        self.size = max(self.size, offset + len(data))

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        out = bytearray()
        pos = offset
        while pos < end:
            index, at = divmod(pos, PAGE)
            n = min(PAGE - at, end - pos)
            page = self.pages.get(index)
            out += page[at:at + n] if page is not None else os.pread(self.fd, n, pos).ljust(n, b"\0")
            pos += n
        return bytes(out)

    def truncate(self, size: int) -> None:
        """The backing file was truncated to `size` (durable); the pages follow it."""
        self.size = size
        last, tail = divmod(size, PAGE)
        for index in [i for i in self.pages if i > last or (i == last and tail == 0)]:
            del self.pages[index]
        if tail and last in self.pages:
            self.pages[last][tail:] = bytes(PAGE - tail)

    def write_through(self) -> int:
        written = 0
        for index in sorted(self.pages):
            data = self.pages[index][:max(0, self.size - index * PAGE)]
            os.pwrite(self.fd, data, index * PAGE)
            written += len(data)
        if os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, self.size)
        self.pages.clear()
        return written

    @property
    def bytes(self) -> int:
        return len(self.pages) * PAGE


class LazyFS(pyfuse3.Operations):
    """A passthrough of `source` (inode numbers are the backing file system's), with each file's
    data held in memory from its write to its fsync."""

    def __init__(self, source: str, fsync_delay: float = 0.0) -> None:
        super().__init__()
        self.fsync_delay = fsync_delay
        self._paths: dict[InodeT, set[str]] = {pyfuse3.ROOT_INODE: {source}}
        self._lookups: defaultdict[InodeT, int] = defaultdict(int)
        self._fd_inode: dict[int, InodeT] = {}
        self._inode_fd: dict[InodeT, int] = {}
        self._opens: dict[int, int] = {}
        self.unsynced: dict[InodeT, Unsynced] = {}
        self.counts = {"fsyncs": 0, "bytes_written": 0, "bytes_synced": 0}

    # ------------------------------------------------------------ names

    def _path(self, inode: InodeT) -> str:
        paths = self._paths.get(inode)
        if not paths:
            raise FUSEError(errno.ENOENT)
        return next(iter(paths))

    def _child(self, parent: InodeT, name: bytes) -> str:
        return os.path.join(self._path(parent), fsdecode(name))

    def _remember(self, inode: InodeT, path: str) -> None:
        self._lookups[inode] += 1
        self._paths.setdefault(inode, set()).add(path)

    def _gone(self, inode: int, path: str) -> None:
        """`path` no longer names `inode`: forget the name, and the unsynced pages of a file with
        no name left and no one holding it open."""
        ino = InodeT(inode)
        if (paths := self._paths.get(ino)) is not None:
            paths.discard(path)
        self._drop_if_unlinked(ino)

    def _drop_if_unlinked(self, inode: InodeT) -> None:
        held = self.unsynced.get(inode)
        if held is not None and inode not in self._inode_fd and os.fstat(held.fd).st_nlink == 0:
            os.close(held.fd)
            del self.unsynced[inode]

    async def forget(self, inode_list: Sequence[tuple[InodeT, int]]) -> None:
        for inode, n in inode_list:
            if self._lookups[inode] > n:
                self._lookups[inode] -= n
                continue
            self._lookups.pop(inode, None)
            if inode != pyfuse3.ROOT_INODE and inode not in self._inode_fd:
                self._paths.pop(inode, None)

    # ------------------------------------------------------------ attributes

    def _attr(self, st: os.stat_result) -> EntryAttributes:
        entry = EntryAttributes()
        for name in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_atime_ns", "st_mtime_ns",
                     "st_ctime_ns"):
            setattr(entry, name, getattr(st, name))
        held = self.unsynced.get(InodeT(st.st_ino))
        entry.st_size = held.size if held is not None else st.st_size
        entry.generation = 0
        entry.entry_timeout = 0
        entry.attr_timeout = 0
        entry.st_blksize = PAGE
        entry.st_blocks = (entry.st_size + 511) // 512
        return entry

    def _stat(self, inode: InodeT) -> EntryAttributes:
        fd = self._inode_fd.get(inode)
        return self._attr(_os(os.fstat, fd) if fd is not None else _os(os.lstat, self._path(inode)))

    async def lookup(self, parent_inode: InodeT, name: bytes, ctx: RequestContext) -> EntryAttributes:
        path = self._child(parent_inode, name)
        attr = self._attr(_os(os.lstat, path))
        if fsdecode(name) not in (".", ".."):
            self._remember(attr.st_ino, path)
        return attr

    async def getattr(self, inode: InodeT, ctx: RequestContext | None = None) -> EntryAttributes:
        return self._stat(inode)

    async def setattr(self, inode: InodeT, attr: EntryAttributes, fields: SetattrFields, fh: FileHandleT | None,
                      ctx: RequestContext) -> EntryAttributes:
        target: int | str = fh if fh is not None else self._path(inode)
        if fields.update_size:
            self._truncate(inode, target, attr.st_size)
        if fields.update_mode:
            _os(os.chmod, target, stat_m.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            _os(os.chown, target, uid, gid, **({} if fh is not None else {"follow_symlinks": False}))
        if fields.update_atime or fields.update_mtime:
            old = _os(os.fstat, target) if isinstance(target, int) else _os(os.lstat, target)
            ns = (attr.st_atime_ns if fields.update_atime else old.st_atime_ns,
                  attr.st_mtime_ns if fields.update_mtime else old.st_mtime_ns)
            _os(os.utime, target, ns=ns, **({} if fh is not None else {"follow_symlinks": False}))
        return self._stat(inode)

    def _truncate(self, inode: InodeT, target: int | str, size: int) -> None:
        _os(os.truncate, target, size)
        if (held := self.unsynced.get(inode)) is not None:
            held.truncate(size)

    async def statfs(self, ctx: RequestContext) -> StatvfsData:
        st = _os(os.statvfs, self._path(pyfuse3.ROOT_INODE))
        out = StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                     "f_namemax"):
            setattr(out, name, getattr(st, name))
        return out

    # ------------------------------------------------------------ directories and names (durable at once)

    async def readlink(self, inode: InodeT, ctx: RequestContext) -> bytes:
        return fsencode(_os(os.readlink, self._path(inode)))

    async def opendir(self, inode: InodeT, ctx: RequestContext) -> FileHandleT:
        return FileHandleT(inode)

    async def readdir(self, fh: FileHandleT, start_id: int, token: ReaddirToken) -> None:
        path = self._path(InodeT(fh))
        entries = []
        for name in _os(os.listdir, path):
            with_path = os.path.join(path, name)
            try:
                entries.append((self._attr(os.lstat(with_path)), name, with_path))
            except OSError:
                continue  # removed meanwhile
        for attr, name, with_path in sorted(entries, key=lambda e: e[0].st_ino):
            if attr.st_ino <= start_id:
                continue
            if not pyfuse3.readdir_reply(token, fsencode(name), attr, attr.st_ino):
                break
            self._remember(attr.st_ino, with_path)

    async def fsyncdir(self, fh: FileHandleT, datasync: bool) -> None:
        await self._disk_wait()

    async def mkdir(self, parent_inode: InodeT, name: bytes, mode: int, ctx: RequestContext) -> EntryAttributes:
        path = self._child(parent_inode, name)
        _os(os.mkdir, path, mode & ~ctx.umask)
        _os(os.chown, path, ctx.uid, ctx.gid)
        return self._created(path)

    async def mknod(self, parent_inode: InodeT, name: bytes, mode: int, rdev: int,
                    ctx: RequestContext) -> EntryAttributes:
        path = self._child(parent_inode, name)
        _os(os.mknod, path, mode & ~ctx.umask, rdev)
        _os(os.chown, path, ctx.uid, ctx.gid)
        return self._created(path)

    async def symlink(self, parent_inode: InodeT, name: bytes, target: bytes, ctx: RequestContext) -> EntryAttributes:
        path = self._child(parent_inode, name)
        _os(os.symlink, fsdecode(target), path)
        _os(os.lchown, path, ctx.uid, ctx.gid)
        return self._created(path)

    async def link(self, inode: InodeT, new_parent_inode: InodeT, new_name: bytes,
                   ctx: RequestContext) -> EntryAttributes:
        path = self._child(new_parent_inode, new_name)
        _os(os.link, self._path(inode), path, follow_symlinks=False)
        return self._created(path)

    def _created(self, path: str) -> EntryAttributes:
        attr = self._attr(_os(os.lstat, path))
        self._remember(attr.st_ino, path)
        return attr

    async def unlink(self, parent_inode: InodeT, name: bytes, ctx: RequestContext) -> None:
        path = self._child(parent_inode, name)
        inode = _os(os.lstat, path).st_ino
        _os(os.unlink, path)
        self._gone(inode, path)

    async def rmdir(self, parent_inode: InodeT, name: bytes, ctx: RequestContext) -> None:
        path = self._child(parent_inode, name)
        inode = _os(os.lstat, path).st_ino
        _os(os.rmdir, path)
        self._gone(inode, path)

    async def rename(self, parent_inode_old: InodeT, name_old: bytes, parent_inode_new: InodeT, name_new: bytes,
                     flags: int, ctx: RequestContext) -> None:
        if flags:
            raise FUSEError(errno.EINVAL)  # RENAME_NOREPLACE / EXCHANGE: callers fall back to a plain rename
        old, new = self._child(parent_inode_old, name_old), self._child(parent_inode_new, name_new)
        try:
            replaced: int | None = os.lstat(new).st_ino
        except OSError:
            replaced = None
        _os(os.rename, old, new)
        inode = InodeT(os.lstat(new).st_ino)
        if (paths := self._paths.get(inode)) is not None:
            paths.discard(old)
            paths.add(new)
        if replaced is not None and replaced != inode:
            self._gone(replaced, new)

    # ------------------------------------------------------------ file data (in memory until fsync)

    def _opened(self, inode: InodeT, fd: int) -> FileInfo:
        self._inode_fd[inode] = fd
        self._fd_inode[fd] = inode
        self._opens[fd] = 1
        return FileInfo(fh=FileHandleT(fd))

    async def open(self, inode: InodeT, flags: int, ctx: RequestContext) -> FileInfo:
        fd = self._inode_fd.get(inode)
        if fd is not None:
            self._opens[fd] += 1
        else:
            path = self._path(inode)
            try:  # one read-write descriptor per inode, whatever each open asked: reads fill pages
                fd = os.open(path, os.O_RDWR)
            except OSError:
                fd = _os(os.open, path, flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND))
            self._opened(inode, fd)
        if flags & os.O_TRUNC:
            self._truncate(inode, fd, 0)
        return FileInfo(fh=FileHandleT(fd))

    async def create(self, parent_inode: InodeT, name: bytes, mode: int, flags: int,
                     ctx: RequestContext) -> tuple[FileInfo, EntryAttributes]:
        path = self._child(parent_inode, name)
        fd = _os(os.open, path, os.O_RDWR | os.O_CREAT | (flags & os.O_EXCL), mode & ~ctx.umask)
        _os(os.fchown, fd, ctx.uid, ctx.gid)
        attr = self._attr(os.fstat(fd))
        inode = InodeT(attr.st_ino)
        self._remember(inode, path)
        if inode in self._inode_fd:  # created by another open meanwhile: share its descriptor
            os.close(fd)
            fd = self._inode_fd[inode]
            self._opens[fd] += 1
            return FileInfo(fh=FileHandleT(fd)), attr
        return self._opened(inode, fd), attr

    async def read(self, fh: FileHandleT, off: int, size: int) -> bytes:
        held = self.unsynced.get(self._fd_inode[fh])
        return held.read(off, size) if held is not None else _os(os.pread, fh, size, off)

    async def write(self, fh: FileHandleT, off: int, buf: bytes) -> int:
        inode = self._fd_inode[fh]
        held = self.unsynced.get(inode)
        if held is None:
            fd = _os(os.dup, fh)
            held = self.unsynced[inode] = Unsynced(fd, os.fstat(fd).st_size)
        held.write(off, buf)
        self.counts["bytes_written"] += len(buf)
        return len(buf)

    async def fsync(self, fh: FileHandleT, datasync: bool) -> None:
        inode = self._fd_inode[fh]
        if (held := self.unsynced.pop(inode, None)) is not None:
            try:
                self.counts["bytes_synced"] += _os(held.write_through)
            finally:
                os.close(held.fd)
        await self._disk_wait()

    async def _disk_wait(self) -> None:
        self.counts["fsyncs"] += 1
        if self.fsync_delay > 0:
            await trio.sleep(self.fsync_delay)

    async def flush(self, fh: FileHandleT) -> None:
        pass  # close() makes nothing durable

    async def release(self, fh: FileHandleT) -> None:
        if self._opens[fh] > 1:
            self._opens[fh] -= 1
            return
        del self._opens[fh]
        inode = self._fd_inode.pop(fh)
        del self._inode_fd[inode]
        os.close(fh)
        self._drop_if_unlinked(inode)

    # ------------------------------------------------------------ counts

    def stats(self) -> dict[str, int]:
        return {**self.counts, "files_unsynced": len(self.unsynced),
                "bytes_unsynced": sum(h.bytes for h in self.unsynced.values())}


async def _serve(fs: LazyFS, stats: Path | None) -> None:
    async def signals() -> None:
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                if signum == signal.SIGUSR1:
                    if stats is not None:
                        tmp = stats.with_name(stats.name + ".part")
                        tmp.write_text(json.dumps(fs.stats()))
                        os.replace(tmp, stats)
                else:
                    pyfuse3.terminate()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(signals)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.lazyfs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--fsync-delay", type=float, default=0.0, help="seconds each fsync takes")
    parser.add_argument("--stats", type=Path, help="where SIGUSR1 writes the counts")
    args = parser.parse_args(argv)
    fs = LazyFS(os.path.abspath(args.backing), args.fsync_delay)
    pyfuse3.init(fs, args.mountpoint, {*pyfuse3.default_options, "fsname=lazyfs", "subtype=lazyfs"})
    print("ready", flush=True)
    try:
        trio.run(_serve, fs, args.stats)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
