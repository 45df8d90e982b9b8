"""What bootstrap/deploy.py takes from the release it installs: the workspace's layout (where
memory, state, logs and the token live, and `.os`'s modes), the memory files (names, owners,
limits), the user-space folders, the token rule, the atomic write and the folder fsync, and the
agent's user with the owners and modes that keep it out of `.os/` (the server applies them at start
too). Defined here once; the product imports them from here (paths.py, config.py, fsutil.py,
memory/files.py, isolation/policy.py, isolation/launch.py).

This is also the home of the product's durability primitives, because the atomic write needs them:
NotDurable, sync_dir, make_dir and make_dirs, synced_after_rename. The product takes them through
fsutil.py (with what only the server needs: the appends, the writer lock); nothing else defines a
folder fsync.

STANDARD LIBRARY ONLY, and no import from this package: deploy.py runs with the system python3
before any venv exists and loads this file by its path from the release it deploys, outside any
package (tests/test_deploy.py holds it to that).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# ---------------------------------------------------------------- the workspace's layout

OS_DIR = ".os"  # the system, beside the user's folders
OS_DIR_MODE = 0o711  # passed through (the agent's user reads its boot prompt in .os/agent/), never listed
PRIVATE_DIR_MODE = 0o700
AGENT_DIR = "agent"  # .os/agent: the one thing in .os/ the agent's user may read (its boot prompt)
PRIVATE_DIRS = ("memory", "state", "logs", "backup")  # in .os/: Sprite OS only
SECRETS = ("token", "state/service.env")  # in .os/: Sprite OS only (0600)


@dataclass(frozen=True)
class Workspace:
    """Where a workspace keeps what the server and the deploy both use: defined here, for both
    (paths.Layout adds the server's own files; deploy.py adds its releases and links)."""

    root: Path

    @property
    def os_dir(self) -> Path:
        return self.root / OS_DIR

    @property
    def memory_dir(self) -> Path:
        return self.os_dir / "memory"

    @property
    def state_dir(self) -> Path:
        """Runtime state that is neither memory nor code: canvas, pid file, locks."""
        return self.os_dir / "state"

    @property
    def logs_dir(self) -> Path:
        return self.os_dir / "logs"

    @property
    def backup_dir(self) -> Path:
        """What a deploy or a migration set aside."""
        return self.os_dir / "backup"

    @property
    def token_file(self) -> Path:
        return self.os_dir / SECRETS[0]

    @property
    def service_env(self) -> Path:
        """The settings `sprite-os service` saved (they include secrets)."""
        return self.os_dir / SECRETS[1]

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "server.pid"

    @property
    def deploy_lock(self) -> Path:
        return self.state_dir / "deploy.lock"

    def make_os_dir(self) -> None:
        """`.os` and its private folders, made where missing, with their modes: the one place
        they are set (the server's start, a deploy, apply_ownership)."""
        os.makedirs(self.os_dir, mode=OS_DIR_MODE, exist_ok=True)
        os.chmod(self.os_dir, OS_DIR_MODE)
        for name in PRIVATE_DIRS:
            (self.os_dir / name).mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
            os.chmod(self.os_dir / name, PRIVATE_DIR_MODE)


@dataclass(frozen=True)
class FileSpec:
    name: str
    owner: Literal["deploy", "daemon"]  # deploy: rewritten by every deploy; daemon: created once, then curated
    max_lines: int
    title: str  # how the boot prompt introduces it
    empty: str  # what the prompt shows when the file is missing or empty


# In boot order. Each has a template, bootstrap/templates/<name>, that deploys install.
MEMORY_FILES: dict[str, FileSpec] = {
    spec.name: spec
    for spec in (
        FileSpec("soul.md", "deploy", 200, "Who you are", "You are a helpful, careful assistant."),
        FileSpec("os.md", "deploy", 200, "How this system works", "No system rules were deployed."),
        FileSpec("tools.md", "daemon", 150, "What you have learned to do", "Nothing recorded yet."),
        FileSpec("files.md", "daemon", 200, "What is in the user's files", "Nothing recorded yet."),
        FileSpec("user.md", "daemon", 200, "Who you are working with", "Nothing recorded yet."),
        FileSpec("context.md", "daemon", 200, "What is going on now", "Nothing recorded yet."),
    )
}

# The user's folders at the workspace root, beside `.os/`.
USER_SPACE_DIRS = ("documents", "ocr", "extractions", "artifacts")


def make_user_space(root: Path) -> None:
    """The user's folders, where missing. A name the agent has made something else (a file, a
    symlink) stays as it is: it is the agent's to make, and it must not stop a start or a deploy."""
    for name in USER_SPACE_DIRS:
        with contextlib.suppress(FileExistsError):
            (root / name).mkdir()

MIN_TOKEN_LENGTH = 16


def token_problem(token: str) -> str | None:
    """Why `token` cannot be the bearer token ("must be ..."), or None if it can."""
    if len(token) < MIN_TOKEN_LENGTH:
        return f"must be at least {MIN_TOKEN_LENGTH} characters"
    if not (token.isascii() and token.isprintable()) or " " in token:
        return "must be printable ASCII without spaces"
    return None


class NotDurable(OSError):
    """The write happened (readers see the new content) but the disk failed the fsync that makes its
    name durable: written, durability not confirmed. A caller that reports failure on OSError still
    may; one that can say it better ("saved, but the disk reported an error") catches this."""


def sync_dir(folder: Path) -> None:
    """fsync a folder: the names made, renamed or removed in it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(name: str, parent: int, mode: int = 0o777, synced: bool = True) -> None:
    """The folder `name` made in the folder open on `parent` (a descriptor: nothing on the way to it is
    followed again), its name fsync'd into that folder when `synced` (a folder's own fsync does not make
    its name durable). A failed fsync removes the folder it made and raises: nothing was written in it yet."""
    os.mkdir(name, mode, dir_fd=parent)
    if synced:
        try:
            os.fsync(parent)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)
            raise


def make_dirs(folder: Path, synced: bool = True) -> None:
    """`folder` and its missing parents, made one level at a time by make_dir."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for new in reversed(missing):
        parent = os.open(new.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            make_dir(new.name, parent, synced=synced)
        except FileExistsError:  # made meanwhile by another writer, which syncs it
            continue
        finally:
            os.close(parent)


def atomic_write(path: Path, data: bytes, mode: int = 0o600, synced: bool = True, *, tag: str = "",
                 before_rename: Callable[[str], None] | None = None) -> None:
    """Write to a temp file beside `path`, fsync it, rename it over `path`, fsync the directory:
    a reader sees the old content or the new, never a torn file. Folders it makes are synced into
    their parents. `synced=False` skips the fsyncs, for a file only read on this machine before it
    could matter after a power loss. The temp file is `.<name>.<tag><8 random characters>.tmp`: a
    `tag` lets a writer's start tell its own leftovers by name. `before_rename(temp path)`: a last
    touch of the written temp file (its times, say). NotDurable: the new content is in place, but
    the folder's fsync after the rename failed."""
    make_dirs(path.parent, synced)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{tag}", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if synced:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if before_rename is not None:
            before_rename(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if synced:
        synced_after_rename(path)


def synced_after_rename(path: Path) -> None:
    """fsync `path`'s folder after `path` was renamed into place; NotDurable if that fails."""
    try:
        sync_dir(path.parent)
    except OSError as exc:
        raise NotDurable(exc.errno, f"{path} was written, but the disk did not confirm it is stored "
                                    f"({exc.strerror})") from exc


# ---------------------------------------------------------------- owners and modes (user isolation)

AGENT_USER = "sprite-agent"  # the agent's Unix user, unless SPRITE_AGENT_USER names another
AGENT_MARK = "Sprite OS agent"  # the comment (GECOS) of a user made for the agent: no other user is one


def _own(path: Path, uid: int, gid: int, mode: int | None = None) -> None:
    """chown (never through a symlink) and chmod one path, if it exists and differs."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.lchown(path, uid, gid)
    if mode is not None and not os.path.islink(path) and (st.st_mode & 0o7777) != mode:
        os.chmod(path, mode)


def _under(top: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """(folder, path, lstat) of everything under the folder `top`, symlinks not followed. For `.os/`,
    which only root writes (its venvs alone are thousands of files, walked at every deploy: one stat
    and no Path object a file). An entry removed meanwhile (a running server's temporary file) is
    passed over."""
    folders = [top]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # gone meanwhile, or unreadable: passed over, as os.walk does
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield folder, entry.path, st
            if stat.S_ISDIR(st.st_mode):
                folders.append(entry.path)


def _take_back(path: str, st: os.stat_result) -> None:
    """`path` (of `.os/`) root's, and written by no one else, set-id bits off."""
    with contextlib.suppress(FileNotFoundError):
        if (st.st_uid, st.st_gid) != (0, 0):
            os.lchown(path, 0, 0)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6022:  # no writes but root's, no set-id
            os.chmod(path, st.st_mode & 0o1755)


def _give_tree(root_fd: int, name: str, uid: int, gid: int) -> None:
    """Give the entry `name` of the workspace root, and all it holds, to the agent's user.

    The agent can change this tree while it is walked (swap a folder for a symlink to /etc between
    the listing and the chown), so nothing here goes by path: os.fwalk descends through directory
    descriptors it checked to be the directories it listed, and each chown is relative to one of
    them and never follows a symlink."""
    _give_at(name, root_fd, uid, gid)
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    for _dirpath, dirnames, filenames, dir_fd in os.fwalk(name, dir_fd=root_fd, follow_symlinks=False):
        for entry in (*dirnames, *filenames):
            _give_at(entry, dir_fd, uid, gid)


def _give_at(name: str, dir_fd: int, uid: int, gid: int) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode) and st.st_uid != uid:
            return  # another name for a file outside user space (a hard link): not the agent's to get
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # removed meanwhile


def apply_ownership(root: Path, uid: int, gid: int, *, deep: bool) -> None:
    """Owners and modes that let the kernel keep the agent's user (uid, gid) out of `.os/`:

    - the workspace root: root-owned, group the agent's, 1770: the agent creates top-level files;
      the sticky bit keeps it from renaming or removing `.os`, which it does not own;
    - `.os/`: root's, 0711: the agent can pass through to `.os/agent/` (its boot prompt, 0750
      root:agent group) but list nothing; memory, state, logs and backup are 0700, the token and
      the service's saved environment 0600: the agent reads no memory file or database, no secret;
    - the user's folders: the agent's.

    `deep` (deploy, migrate) also gives every top-level entry and all it holds to the agent, and
    takes back anything under `.os/` that is not root's, or that group or others may write; the
    server's start does only the top level (cheap). Idempotent."""
    os_dir = Workspace(root).os_dir
    _own(root, 0, gid, 0o1770)
    os_dir.mkdir(mode=OS_DIR_MODE, exist_ok=True)
    _own(os_dir, 0, 0, OS_DIR_MODE)
    (os_dir / AGENT_DIR).mkdir(exist_ok=True)
    _own(os_dir / AGENT_DIR, 0, gid, 0o750)
    for name in PRIVATE_DIRS:
        _own(os_dir / name, 0, 0, PRIVATE_DIR_MODE)
    for name in SECRETS:
        _own(os_dir / name, 0, 0, 0o600)
    make_user_space(root)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in os.listdir(root_fd):
            if name == OS_DIR:
                continue
            if deep:
                _give_tree(root_fd, name, uid, gid)
            else:
                _give_at(name, root_fd, uid, gid)
    finally:
        os.close(root_fd)
    if deep:
        top = os.lstat(os_dir)
        _take_back(str(os_dir), top)
        agent_dir = str(os_dir / AGENT_DIR)
        for folder, path, st in _under(str(os_dir)) if stat.S_ISDIR(top.st_mode) else ():
            if path == agent_dir or folder == agent_dir:
                continue  # set above; what is in it is written 0640 root:agent group by the server
            _take_back(path, st)


# What the kernel must enforce for the agent's user (set by deploy, checked by the server's start):
# no hard link to a file the agent can't write (the token), no following another user's symlink
# in a sticky world-writable directory (/tmp).
SYSCTLS = {"fs.protected_hardlinks": "1", "fs.protected_symlinks": "1"}


def ensure_sysctls() -> list[str]:
    """Set SYSCTLS in the running kernel where they differ; returns the ones changed. Root only."""
    changed = []
    for name, want in SYSCTLS.items():
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.read_text().strip() != want:
            path.write_text(want + "\n")
            changed.append(name)
    return changed


class AgentUserRefused(ValueError):
    """A user of that name exists and is not the agent's own: using it would give the agent its files
    and groups, and every start would kill its processes."""


NOLOGINS = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")


def is_agent_user(gecos: str) -> bool:
    return gecos.split(",", 1)[0] == AGENT_MARK


def made_by_an_earlier_release(name: str, home: str, shell: str, uid: int, gecos: str) -> bool:
    """An unmarked user with exactly the shape releases before the mark gave the agent's: the default
    name, home /var/lib/<name>, no login shell, no comment. Anything else may be anyone's."""
    return name == AGENT_USER and home == f"/var/lib/{name}" and shell in NOLOGINS and uid != 0 and not gecos


def ensure_agent_user(name: str = AGENT_USER) -> tuple[int, int, Path]:
    """Create the agent's user if missing (a system user, no login shell, marked AGENT_MARK, and an
    empty home outside the workspace: the mount point of each session's fresh one, isolation/launch.py):
    (uid, gid, home). Idempotent. Root only.

    A user of that name that is not marked is refused (AgentUserRefused): it may be a service's
    (postgres, nobody) or a person's. One exception: the default name with exactly the shape an
    earlier release gave its agent's user (home /var/lib/<name>, no login shell), which is marked."""
    import pwd
    import shutil
    import subprocess

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        nologin = next((s for s in NOLOGINS[:2] if os.path.exists(s)), "/bin/false")
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        run = subprocess.run([useradd, "--system", "--user-group", "--shell", nologin, "--home-dir",
                              f"/var/lib/{name}", "--no-create-home", "--comment", AGENT_MARK, name],
                             capture_output=True, text=True, check=False)
        if run.returncode not in (0, 9):  # 9: it exists (made meanwhile by another process)
            raise OSError(f"useradd {name} failed: {run.stderr.strip()[:300]}") from None
        entry = pwd.getpwnam(name)
    if not is_agent_user(entry.pw_gecos):
        if not made_by_an_earlier_release(name, entry.pw_dir, entry.pw_shell, entry.pw_uid, entry.pw_gecos):
            raise AgentUserRefused(
                f"the user {name!r} exists and was not made for the agent (its comment is not {AGENT_MARK!r}): "
                "it may be a service's or a person's; set SPRITE_AGENT_USER to a new name and the deploy creates it")
        usermod = shutil.which("usermod") or "/usr/sbin/usermod"
        subprocess.run([usermod, "--comment", AGENT_MARK, name], capture_output=True, check=True)
    home = Path(entry.pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    return entry.pw_uid, entry.pw_gid, home
