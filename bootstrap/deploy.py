#!/usr/bin/env python3
"""Deploy a Sprite OS release into a workspace. What Bridge runs on a Sprite.

    python3 deploy.py --workspace /workspace --release sprite-os-0.2.0.tar.gz [--token-file F]
    python3 deploy.py --workspace /workspace --from-checkout /path/to/checkout
    python3 deploy.py --workspace /workspace --rollback

STDLIB ONLY: this runs with the system python3, before any virtualenv exists.

Layout it maintains (W = workspace, V = version, H = sha256(requirements.lock)[:16]):

    W/.os/releases/<V>/{src/, bootstrap/, VERSION, requirements.lock, lib/sprite_os -> ../src,
                        venv -> ../../venvs/<H>, .complete}
    W/.os/venvs/<H>/            one venv per distinct lock, `.complete` once fully built
    W/.os/current -> releases/<V>     the single atomic switch point
    W/.os/previous -> releases/<P>    what `--rollback` returns to; kept by garbage collection
    W/.os/{src -> current/src, .venv -> current/venv, VERSION -> current/VERSION}
    W/.os/lib/sprite_os -> ../src     on the venv's import path through `sprite_os.pth`
    W/.os/bin/sprite-os               the command: runs the current release

`current` only ever points at a complete release whose venv is complete, so a
deploy that fails or is killed at any step leaves the previous version starting
and serving. A deploy of the version already current returns at once.

It holds no copy of what the product defines: the memory files (template names), the user-space
folders, the token rule and the atomic write come from the release it installs, from that
release's stdlib-only src/deploy_contract.py (see load_contract).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$")
CONTRACT = "deploy_contract.py"  # in a release's src/ (a checkout's os_src/)
CONTRACT_NAMES = ("MEMORY_FILES", "USER_SPACE_DIRS", "make_user_space", "token_problem", "atomic_write", "sync_dir",  # what this script uses
                  "AGENT_USER", "SYSCTLS", "ensure_agent_user", "AgentUserRefused", "apply_ownership",
                  "ensure_sysctls", "Workspace")
SYSCTL_CONF = Path("/etc/sysctl.d/60-sprite-os.conf")
SKIP_NAMES = {"__pycache__", ".DS_Store", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# How the commands a deploy runs say their error: sprite-os (install-templates, service), migrate-v1, pip.
ERROR_LINES = ("sprite-os: error:", "migrate: error:", "ERROR:")
STAGED_MARKS = (".complete", "venv")  # what stage_release adds to a release's files (lib/ holds a folder link)
REMOVING = ".removing-"  # in the name of a folder set aside to be removed
DEPLOY_MARKS = (".partial-", REMOVING)  # in the name of a folder a deploy is making or removing
MANIFEST = "MANIFEST"  # in a release, right after VERSION: `<sha256>  <name>` of each of its other files
# What deploy.log keeps of one command's output: its first and last lines, each cut at LOG_LINE characters.
LOG_HEAD, LOG_TAIL, LOG_LINE = 300, 100, 1000
VENV_COPY_RESERVE = 64 * 1024 * 1024  # what a venv copy must leave free on its disk, for the serving server
DISK_FULL = os.strerror(errno.ENOSPC)  # "No space left on device", as cp, pip and Python say it


class DeployError(Exception):
    """A deploy cannot go on. The message is one line, fit for a terminal."""


# ---------------------------------------------------------------- output


class Output:
    """Progress lines on stdout; everything, subprocess output included, in .os/logs/deploy.log."""

    def __init__(self) -> None:
        self._log: Path | None = None

    def open_log(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if path.stat().st_size > 1_000_000:
                os.replace(path, path.with_name(path.name + ".1"))
        self._log = path
        self.log(f"---- deploy pid={os.getpid()} argv={' '.join(map(shlex.quote, sys.argv[1:]))}")

    def log(self, line: str) -> None:
        if self._log is not None:
            # backslashreplace: a name that is not UTF-8 (a tarball's, refused) is written, not a traceback
            with contextlib.suppress(OSError), open(self._log, "a", encoding="utf-8", errors="backslashreplace") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line.rstrip()}\n")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log(line)


out = Output()


def step(name: str, version: str, **info: object) -> None:
    extra = "".join(f" {k}={v}" for k, v in info.items())
    out.say(f"deploy: step={name} version={version}{extra}")


# ---------------------------------------------------------------- the workspace


class Paths:
    """Deploy's own names (the releases, the venvs, the links, the command), and, once a release's
    facts are read (`use`), the ones it shares with the server: where memory, state, logs, the
    token and the pid file live, and `.os`'s modes, defined once in the contract (its Workspace)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.os = root / ".os"  # found before any release is read; every release's contract must agree
        self.releases = self.os / "releases"
        self.venvs = self.os / "venvs"
        self.current = self.os / "current"
        self.previous = self.os / "previous"
        self.src = self.os / "src"
        self.venv = self.os / ".venv"
        self.version = self.os / "VERSION"
        self.lib = self.os / "lib"
        self.bin = self.os / "bin"
        self.command = self.bin / "sprite-os"
        self._shared: Any = None
        self._sync_dir: Any = None

    def use(self, contract: types.ModuleType) -> None:
        shared = contract.Workspace(self.root)
        if shared.os_dir != self.os:
            raise DeployError(f"the release keeps its system in {shared.os_dir}, not {self.os}: "
                              "deploy it with its own bootstrap/deploy.py")
        self._shared = shared
        self._sync_dir = contract.sync_dir

    @property
    def shared(self) -> Any:
        """The contract's Workspace: what the server and the deploy both use."""
        if self._shared is None:
            raise AssertionError("no release's facts read yet (Paths.use)")
        return self._shared

    def sync_dir(self, folder: Path) -> None:
        """The contract's folder fsync: the names made, renamed or removed in `folder` survive a power loss."""
        _ = self.shared  # the release's facts read
        self._sync_dir(folder)


def release_name(link: Path) -> str | None:
    """The release a `current`/`previous` link names (`releases/<V>` -> `<V>`), or None."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    parts = Path(target).parts
    return parts[1] if len(parts) == 2 and parts[0] == "releases" else None


def is_complete_release(path: Path) -> bool:
    return (path / ".complete").is_file() and (path / "venv" / ".complete").is_file()


def already_at(p: Paths, version: str) -> bool:
    """The lazy check: a handful of stat calls, no imports, no subprocesses."""
    try:
        deployed = p.version.read_text().strip()
    except OSError:
        return False
    # The venv belongs to the system python: after an upgrade its bin/python dangles, or (a link
    # to `python3`) runs a newer python that ignores the venv's lib/python3.X. Either way it is dead.
    return (deployed == version and release_name(p.current) == version and is_complete_release(p.current)
            and venv_usable(p.current / "venv", deploying_python()))


def point(p: Paths, link: Path, target: str) -> None:
    """Make `link` a symlink to `target` atomically: a reader sees the old target or the new."""
    tmp = link.with_name(f".{link.name}.tmp-{secrets.token_hex(4)}")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    p.sync_dir(link.parent)


def remove(path: Path) -> None:
    """Remove a file, link or folder. A folder is first renamed out of its name (`<name>.removing-<random>`,
    beside it): a removal cut short (a deploy killed in its gc, a power loss) never leaves a half-removed
    release or venv, its `.complete` still there, under the name a later deploy would reuse as it is. What
    is left is removed by the next deploy's gc, or by a no-op deploy or a rollback (remove_leftovers)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(set_aside(path))


def set_aside(path: Path) -> Path:
    """`path` renamed beside it to a name only removals use (`<name>.removing-<random>`), to be removed."""
    doomed = path.with_name(f"{path.name}{REMOVING}{secrets.token_hex(4)}")
    os.rename(path, doomed)
    return doomed


@contextlib.contextmanager
def removed_on_failure(folder: Path) -> Iterator[None]:
    """What the block makes in `folder` (a release or venv being staged, never yet named by anything)
    is removed if it fails: a deploy that ran out of disk copying a venv left its hundreds of MB
    behind, and the serving version a full disk until the next deploy. (A kill leaves it: the next
    deploy removes it.)"""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            remove(folder)
        raise


# ---------------------------------------------------------------- the release's facts


def load_contract(src: Path) -> types.ModuleType:
    """The deploy_contract module of the release whose package is `src`, loaded by its path.

    Its source is compiled in memory, so loading writes nothing (no __pycache__) into a release
    or a checkout. It imports only the standard library, so the system python3 can run it."""
    path = src / CONTRACT
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise DeployError(f"cannot read {path} ({exc.strerror}): not a Sprite OS release, or one older than "
                          "this deploy.py (an older release is deployed by its own bootstrap/deploy.py)") from None
    return contract_from(source, path)


def contract_from(source: bytes, path: Path) -> types.ModuleType:
    """A deploy_contract module from its source (`path` names it in errors and tracebacks)."""
    try:
        code = compile(source, str(path), "exec")
    except (SyntaxError, ValueError) as exc:
        raise DeployError(f"cannot load {path}: {exc}") from None
    module = types.ModuleType(f"sprite_os_contract_{hashlib.sha256(bytes(path)).hexdigest()[:12]}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses look up the module of the class they make
    try:
        exec(code, module.__dict__)
    except Exception as exc:  # whatever a broken release raises, one line
        raise DeployError(f"cannot load {path}: {type(exc).__name__}: {exc}") from None
    missing = [name for name in CONTRACT_NAMES if not hasattr(module, name)]
    if missing:
        raise DeployError(f"{path} has no {', '.join(missing)}: deploy that release with its own bootstrap/deploy.py")
    return module


def template_names(contract: types.ModuleType) -> list[str]:
    """bootstrap/templates/<name> of each memory file, as the release defines them."""
    return [f"bootstrap/templates/{name}" for name in contract.MEMORY_FILES]


# ---------------------------------------------------------------- release sources


def release_entries(checkout: Path) -> list[tuple[str, Path]]:
    """(name in the release, file in a checkout) of every file a release holds, VERSION first.

    Shared with build_release.py, so a tarball and a --from-checkout deploy hold the same files.
    The templates are those the checkout's own deploy_contract names.
    """
    src = checkout / "os_src"
    entries = [("VERSION", checkout / "VERSION"),
               ("requirements.lock", checkout / "bootstrap" / "requirements.lock"),
               ("bootstrap/deploy.py", checkout / "bootstrap" / "deploy.py")]
    entries += [(name, checkout / name) for name in template_names(load_contract(src))]
    for folder, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_NAMES)
        for name in sorted(files):
            if name in SKIP_NAMES or name.endswith((".pyc", ".pyo")):
                continue
            path = Path(folder) / name
            entries.append(("src/" + path.relative_to(src).as_posix(), path))
    for name, path in entries:  # a MANIFEST is UTF-8: such a name could be neither listed nor packed
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise DeployError(f"{str(path).encode('utf-8', 'surrogateescape')!r} has a name that is not UTF-8: "
                              "rename or remove it") from None
    missing = [str(path) for _, path in entries if not path.is_file()]
    if missing:
        raise DeployError(f"not a Sprite OS checkout, missing: {', '.join(missing[:5])}")
    if not (src / "__init__.py").is_file():
        raise DeployError(f"not a Sprite OS checkout: no {src / '__init__.py'}")
    return entries


def manifest(entries: Iterable[tuple[str, Path]]) -> bytes:
    """A release's MANIFEST: the sha256 and the name of each file (name in the release, file it is
    read from), one a line. build_release.py packs it; a checkout's deploy writes it as it stages."""
    return "".join(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n" for name, path in entries).encode()


def check_manifest(release: Path, version: str, staged: bool = False) -> None:
    """The staged `release` holds exactly the files its MANIFEST names, each with its sha256: a
    tarball cut short, re-packed without a file, or with a file damaged or added is refused before
    anything runs from it (the server would fail to start only at the restart, or not at all
    until the next one). `staged`: one staged whole earlier, with what staging and running it add
    beside its files (STAGED_MARKS, byte-code caches)."""
    try:
        text = (release / MANIFEST).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise DeployError(f"release {version} has no readable {MANIFEST}: not built by build_release.py, or "
                          "older than this deploy.py (an older release is deployed by its own bootstrap/deploy.py)"
                          ) from None
    listed: dict[str, str] = {}
    # By "\n" alone (a "\r\n" taken as one): splitlines() also splits at \x0c, \x1c-\x1e, \x85 and
    # U+2028/9, which a file name may hold, and a good release was refused as malformed.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for line in (line.removesuffix("\r") for line in lines):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise DeployError(f"release {version} has a malformed {MANIFEST} line: {line[:100]!r}")
        listed[name] = digest
    found = set()
    for folder, _dirs, files in os.walk(release):
        found |= {(Path(folder) / name).relative_to(release).as_posix() for name in files}
    found.discard(MANIFEST)
    missing = sorted(set(listed) - found)
    damaged = sorted(name for name in set(listed) & found if not (release / name).is_file() or
                     hashlib.sha256((release / name).read_bytes()).hexdigest() != listed[name])
    extra = sorted(name for name in found - set(listed) if not staged or
                   (name not in STAGED_MARKS and "__pycache__" not in name.split("/")))
    problems = [f"{what} {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"
                for what, names in (("missing", missing), ("damaged", damaged), ("not listed", extra)) if names]
    if problems:
        raise DeployError(f"release {version} does not match its {MANIFEST}: {'; '.join(problems)}")


def check_version(version: str, where: object) -> str:
    if not VERSION_RE.match(version):
        raise DeployError(f"bad version {version!r} in {where}: letters, digits and ._+- only")
    if any(mark in version for mark in DEPLOY_MARKS):
        # A release so named would be taken for the deploy's own leftover (a gc's removal cut short, a
        # --force re-stage) and removed, or replaced by itself.
        raise DeployError(f"bad version {version!r} in {where}: {' and '.join(DEPLOY_MARKS)} name the deploy's "
                          "own leftovers")
    return version


class Checkout:
    def __init__(self, path: Path) -> None:
        self.path = path

    def version(self) -> str:
        try:
            return check_version((self.path / "VERSION").read_text().strip(), self.path / "VERSION")
        except OSError as exc:
            raise DeployError(f"cannot read {self.path / 'VERSION'}: {exc.strerror}") from None

    def contract(self) -> types.ModuleType:
        """The facts the release will be staged with (its staged copy's are loaded again)."""
        return load_contract(self.path / "os_src")

    def manifest(self) -> bytes:
        """The MANIFEST a deploy of it stages (the sha256 of each of its files)."""
        return manifest(release_entries(self.path))

    def stage(self, into: Path) -> None:
        entries = release_entries(self.path)
        for name, path in entries:
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (into / MANIFEST).write_bytes(manifest(entries))  # of the checkout's files: the copies are checked by it


class Tarball:
    """A release built by build_release.py: VERSION, requirements.lock, bootstrap/, src/ at the
    top (or all inside one top-level folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _open(self, mode: str = "r|*") -> tarfile.TarFile:
        try:
            return tarfile.open(self.path, mode)
        except (OSError, tarfile.TarError) as exc:
            raise DeployError(f"cannot read release {self.path}: {exc}") from None

    def version(self) -> str:
        # VERSION is the tarball's first member, so this reads only its first block.
        with self._open() as tf:
            try:
                for member in tf:
                    parts = Path(member.name).parts
                    if member.isfile() and parts and parts[-1] == "VERSION" and len(parts) <= 2:
                        f = tf.extractfile(member)
                        assert f is not None
                        return check_version(f.read(100).decode("utf-8", "replace").strip(), self.path)
            except (OSError, tarfile.TarError, EOFError) as exc:
                raise DeployError(f"cannot read release {self.path}: {exc}") from None
        raise DeployError(f"release {self.path} has no VERSION file")

    def manifest(self) -> bytes | None:
        """Its MANIFEST (build_release.py packs it right after VERSION: only the tarball's first blocks are
        read), or None when it has none. A tarball packed again by hand may hold it anywhere, so the rest is
        read when it is not there: stopping after the first members said such a rebuilt release was the one
        deployed."""
        with self._open() as tf:
            try:
                for member in tf:
                    parts = Path(member.name).parts
                    if member.isfile() and parts[-1:] == (MANIFEST,) and len(parts) <= 2:
                        f = tf.extractfile(member)
                        assert f is not None
                        return f.read()
            except (OSError, tarfile.TarError, EOFError) as exc:
                raise DeployError(f"cannot read release {self.path}: {exc}") from None
        return None

    def contract(self) -> types.ModuleType:
        """The facts the release will be staged with, read from the tarball into memory (where the
        deploy keeps its lock and log); the staged copy's are loaded again, and rule from then on."""
        with self._open("r:*") as tf:
            try:
                for member in self._safe_members(tf):
                    parts = Path(member.name).parts
                    if member.isfile() and parts[-2:] == ("src", CONTRACT) and len(parts) <= 3:
                        f = tf.extractfile(member)
                        assert f is not None
                        return contract_from(f.read(), Path(self.path, *parts))
            except (OSError, tarfile.TarError, EOFError) as exc:
                raise DeployError(f"cannot read release {self.path}: {exc}") from None
        raise DeployError(f"release {self.path} has no src/{CONTRACT}: not a Sprite OS release, or one older than "
                          "this deploy.py (an older release is deployed by its own bootstrap/deploy.py)")

    def _safe_members(self, tf: tarfile.TarFile) -> list[tarfile.TarInfo]:
        """Every entry, once each is known to be a plain file or folder inside the release."""
        members = tf.getmembers()
        for member in members:
            name = Path(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                raise DeployError(f"release {self.path} holds an unsafe entry: {member.name!r}")
        return members

    def stage(self, into: Path) -> None:
        with self._open("r:*") as tf:
            self._safe_members(tf)
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tf.extractall(into, **kwargs)  # type: ignore[arg-type]
        tops = list(into.iterdir())
        if not (into / "VERSION").exists() and len(tops) == 1 and (tops[0] / "VERSION").is_file():
            for entry in list(tops[0].iterdir()):  # one top-level folder: move its content up
                os.rename(entry, into / entry.name)
            tops[0].rmdir()
        for generated in ("lib", "venv", ".complete"):  # made by the deploy, never taken from a tarball
            remove(into / generated)


# ---------------------------------------------------------------- steps


def lock_hash(lock: bytes) -> str:
    return hashlib.sha256(lock).hexdigest()[:16]


def stage_release(p: Paths, source: Checkout | Tarball, version: str,
                  force: bool) -> tuple[Path, types.ModuleType]:
    """releases/<version>, complete, and the facts it defines (its deploy_contract, loaded from
    the staged copy: what a tarball holds is only known, and checked, once it is unpacked)."""
    final = p.releases / version
    if final.is_dir() and (final / ".complete").is_file() and not force:
        # Staged whole by an earlier deploy that failed later (its migrate, say), or kept: reused only if
        # it is this release, and whole. One rebuilt under its version (a fix) ran the old copy's steps again;
        # a file removed or changed since (by hand, a disk error) went with it at every deploy of it.
        damage = None
        if not differs(final, source):
            try:
                check_manifest(final, version, staged=True)
                return final, load_contract(final / "src")
            except DeployError as exc:
                damage = str(exc)
        if damage is not None:
            out.say(f"deploy: the {version} staged by an earlier deploy is damaged ({damage}); staging it afresh")
        elif version in releases_kept(p):
            raise DeployError(f"this release of {version} is not the {version} staged in {final} (its {MANIFEST} "
                              "differs), which is current, previous or running: a rebuilt release needs a new "
                              "VERSION, or deploy it with --force")
        else:
            out.say(f"deploy: the {version} staged by an earlier deploy is not this release (its {MANIFEST} "
                    "differs); staging it afresh")
    partial = p.releases / f"{version}.partial-{secrets.token_hex(4)}"
    partial.mkdir(parents=True)
    with removed_on_failure(partial):
        source.stage(partial)
        give_packed_modes(partial)
        got = (partial / "VERSION").read_text().strip() if (partial / "VERSION").is_file() else None
        if got != version:
            raise DeployError(f"release content has VERSION {got!r}, expected {version!r}")
        check_manifest(partial, version)
        contract = load_contract(partial / "src")
        for needed in ("src/__init__.py", "src/__main__.py", "requirements.lock", *template_names(contract)):
            if not (partial / needed).is_file():
                raise DeployError(f"release {version} is incomplete: no {needed}")
        (partial / "lib").mkdir()
        os.symlink("../src", partial / "lib" / "sprite_os")
        os.symlink(f"../../venvs/{lock_hash((partial / 'requirements.lock').read_bytes())}", partial / "venv")
        contract.atomic_write(partial / ".complete", f"{version}\n".encode(), 0o644)
    if final.exists() or final.is_symlink():
        if version in releases_kept(p):
            return partial, contract  # re-staging a kept release (--force): put in place once it is checked
        remove(final)
    os.rename(partial, final)
    p.sync_dir(p.releases)
    return final, contract


def releases_kept(p: Paths) -> set[str]:
    """The releases a deploy never removes nor replaces unchecked: `current`, `previous` and the running
    server's (which may be neither after a deploy with --no-restart)."""
    kept = {name for name in (release_name(p.current), release_name(p.previous)) if name}
    return kept | releases_in_use(server_pid(p))


def differs(staged: Path, source: Checkout | Tarball) -> bool:
    """Whether the release `source` is not the one staged as `staged`, by their MANIFESTs (a release or a
    source without one, from before them: not known to differ)."""
    try:
        mine = (staged / MANIFEST).read_bytes()
    except OSError:
        return False
    return source.manifest() not in (None, mine)


def replace_kept(p: Paths, staged: Path, version: str) -> Path:
    """A kept release (releases_kept), re-staged by --force as `staged`, replaced by it. Only after the import
    check: a re-staged release that could not start was put in place before it, `current` naming it while the
    deploy said nothing was switched, or the running server's copy (or `previous`, the rollback's target)
    replaced by code that could not start. When it is `current`, `current` names the staged copy while the
    old one is replaced. The old one is set aside and the staged one renamed in before the old is deleted:
    deleted first, the running server's release was missing while the delete ran (its lazy imports, the
    SDK at its first turn); now only between two renames."""
    final = p.releases / version
    live = release_name(p.current) == version
    if live:
        point(p, p.current, f"releases/{staged.name}")
    old = set_aside(final) if final.exists() else None
    os.rename(staged, final)
    p.sync_dir(p.releases)
    if live:
        point(p, p.current, f"releases/{version}")
    if old is not None:
        shutil.rmtree(old)
    return final


def give_packed_modes(tree: Path) -> None:
    """Folders 0755, files 0644, or 0755 when their owner may run them, all the deploying user's: what
    build_release.py packs. A release's own modes and owners are not trusted: a file under .os (which
    the agent's user may pass through) that is world-writable, or some user's, would let that user
    change the code root runs. tarfile's data filter clears group and other write bits and the owners,
    but Pythons before 3.11.4 have none, and a checkout's copy keeps its modes."""
    uid, gid = os.geteuid(), os.getegid()
    for folder, _dirs, files in os.walk(tree):
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.chown(path, uid, gid)
            os.chmod(path, 0o755 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o100 else 0o644)


def python_version_of_venv(venv: Path) -> str | None:
    try:
        for line in (venv / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return ".".join(value.strip().split(".")[:2])
    except OSError:
        pass
    return None


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise DeployError(f"venv {venv} has no lib/python3*/site-packages")
    return found[0]


def run(cmd: list[str], what: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
        echo: tuple[str, ...] = (), seconds: float | None = None) -> None:
    """Run a command; its output goes to the deploy log (lines starting with `echo` also to stdout). A
    failure is said with the first line the command printed as its error, else its last line: a failed
    `service restart` prints its error, then the tail of the server's logs below it, which may hold an
    older server's error line (from a start that failed days ago), not this one's. With `seconds`, a
    command still running then is killed, with whatever it started (its own process group), and said so.
    A command given no `env` (cp, venv, pip: the host's tools) runs with LC_ALL=C, so that what it says is
    in the English read_output looks for (DISK_FULL): on a localized host cp says a full disk in its
    language. One given an `env` runs the release's Python, whose messages are English whatever the locale
    (Python sets LC_CTYPE alone), and keeps the host's locale: the restart's server inherits it."""
    out.log(f"$ {' '.join(map(shlex.quote, cmd))}")
    if env is None:
        env = {**os.environ, "LC_ALL": "C"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd, text=True, errors="replace", start_new_session=seconds is not None)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    timer = threading.Timer(seconds, stop) if seconds is not None else None
    if timer:
        timer.start()
    try:
        last, error = read_output(proc, echo)
    finally:
        if timer:
            timer.cancel()
    code = proc.wait()
    if stopped.is_set():
        raise DeployError(f"{what} failed: still running after {seconds:g} s, stopped")
    if code != 0:
        raise DeployError(f"{what} failed (exit {code}): {(error or last)[:300]}")


def read_output(proc: subprocess.Popen[str], echo: tuple[str, ...]) -> tuple[str, str]:
    """A command's output to the log (and stdout, for `echo`); its last line, and its first error line: the
    first that is one of ERROR_LINES or says the disk is full (`cp` onto a full disk says it once a file, and
    the first is the cause). Not a full disk said after the error line: a failed restart's tail of the server's
    logs may hold an older server's, from a day the disk was full, not this start's reason. The log takes its first LOG_HEAD and last LOG_TAIL lines, each cut at LOG_LINE
    characters, and the count of those between: a deploy's log stays small whatever a command prints."""
    last, error = "no output", ""
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
    lines = 0  # of those not said (said, a line is logged as it is: it takes no place of the head's or tail's)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if echo and line.startswith(echo):
            out.say(line)
        elif (lines := lines + 1) <= LOG_HEAD:
            out.log(line[:LOG_LINE])
        else:
            tail.append(line[:LOG_LINE])
        if line.strip():
            last = line.strip()
            if not error and last.startswith(ERROR_LINES):
                error = last
            elif not error and DISK_FULL in last:
                error = f"no space left on device: {last}"
    if lines > LOG_HEAD + len(tail):
        out.log(f"... {lines - LOG_HEAD - len(tail):,} lines of its output not logged")
    for line in tail:
        out.log(line)
    return last, error


def deploying_python() -> str:
    return ".".join(map(str, sys.version_info[:2]))


def venv_usable(venv: Path, want: str) -> bool:
    """Complete, its python resolves, and it is the deploying python's minor version."""
    return ((venv / ".complete").is_file() and os.path.exists(venv / "bin" / "python")
            and python_version_of_venv(venv) == want)


def venv_damage(venv: Path) -> str | None:
    """The first file the venv's packages were installed with (each `*.dist-info/RECORD`) that is missing,
    named from the venv, or None: a complete venv damaged since (a file removed by hand, a disk error) failed
    the import check of every deploy sharing its lock. One stat a file, byte-code aside (Python makes it
    again): 50 to 60 ms for the lock's 47 packages (11,900 files). RECORD is CSV (pip quotes a name holding a
    comma); a name outside the venv (an absolute path, `../` past its root) is not the venv's to miss."""
    root = os.path.normpath(venv.absolute())
    inside = root.rstrip(os.sep) + os.sep
    for site in sorted(venv.glob("lib/python3*/site-packages")):
        folder = str(site.absolute())
        for record in sorted(site.glob("*.dist-info/RECORD")):
            try:
                rows = list(csv.reader(record.read_text(encoding="utf-8", errors="replace").splitlines()))
            except (OSError, csv.Error):
                return str(record.relative_to(venv))
            for row in rows:
                name = row[0] if row else ""
                if not name or name.endswith(".pyc") or "__pycache__" in name:
                    continue
                path = os.path.normpath(os.path.join(folder, name))
                if path.startswith(inside) and not os.path.lexists(path):
                    return os.path.relpath(path, root)
    return None


def ensure_venv(p: Paths, release: Path, contract: types.ModuleType, wheelhouse: Path | None, cache: Path | None,
                link: bool = False) -> tuple[str, str]:
    """Make `venvs/<H>` complete and usable. Returns (H, how): reused, copied, linked or built."""
    h = Path(os.readlink(release / "venv")).name
    venv = p.venvs / h
    want = deploying_python()
    usable = venv_usable(venv, want)
    damage = venv_damage(venv) if usable else None
    if usable and damage is None:
        write_pth(venv, p, contract)
        return h, "reused"
    p.venvs.mkdir(parents=True, exist_ok=True)
    for stale in (*p.venvs.glob(f"{h}.partial-*"), *p.venvs.glob(f"{h}.old-*")):
        remove(stale)
    cached = cache / h if cache else None
    from_cache = bool(cached and venv_usable(cached, want) and venv_damage(cached) is None)
    # A complete venv that is not usable (its python was upgraded) or damaged may still be what a running
    # server runs from: the replacement is made beside it and renamed over, as a copy always is.
    # A missing or half-built one is built in place.
    replace = (venv / ".complete").is_file()
    if damage is not None:
        out.say(f"deploy: venv={h} is damaged ({damage} is missing); rebuilding it")
    elif replace:
        out.say(f"deploy: venv={h} is unusable (its python is gone or not {want}); rebuilding it")
    else:
        remove(venv)
    dest = p.venvs / f"{h}.partial-{secrets.token_hex(4)}" if replace or from_cache else venv
    try:
        with removed_on_failure(dest):
            if from_cache:
                assert cached is not None
                how = copy_cached_venv(cached, dest, link)
            else:
                if cached:
                    out.log(f"venv cache {cached} is not a complete, whole python {want} venv; building")
                how = build_venv(release, dest, wheelhouse)
            write_pth(dest, p, contract)
            contract.atomic_write(dest / ".complete", f"{how}\n".encode(), 0o644)
    except (DeployError, OSError) as exc:
        # A damaged venv whose python runs (a file removed: maybe a bin/ script nothing needs) that cannot be
        # rebuilt (no network, no wheelhouse, no whole cache entry) is used as it is, the import check deciding:
        # the deploy failed at this step where it went through before damage was looked for.
        if damage is None:
            raise
        out.say(f"deploy: venv={h} is damaged ({damage} is missing) and could not be rebuilt ({exc}); "
                "using it as it is, the import check decides")
        write_pth(venv, p, contract)
        return h, "reused"
    if dest != venv:
        swap_in(p, dest, venv)
    return h, how


def copy_cached_venv(cached: Path, target: Path, link: bool) -> str:
    how = "copied"
    if link:  # hard links: instant and no extra disk, if the cache is on this filesystem
        try:
            run(["cp", "-a", "--link", str(cached), str(target)], "linking the cached venv")
            how = "linked"
        except DeployError as exc:
            out.say(f"deploy: cannot hard-link the venv cache ({exc}); copying it")
            remove(target)
    if how == "copied":
        need_room(cached, target.parent, link)
        run(["cp", "-a", str(cached), str(target)], "copying the cached venv")
    (target / ".complete").unlink()
    return how


def need_room(cached: Path, into: Path, linked: bool = False) -> None:
    """Refuse a copy of `cached` that the disk of `into` has no room for, VENV_COPY_RESERVE left over: one
    made all the same filled the disk before it failed, and the serving server's writes met a full disk for
    as long as it ran. Its size is its files' blocks, each counted once (cp -a keeps hard links). `linked`:
    hard links were tried and refused, so the refusal does not send the operator to --venv-cache-links."""
    size, seen = 0, set()
    for folder, _dirs, files in os.walk(cached):
        for name in (folder, *(os.path.join(folder, f) for f in files)):
            st = os.lstat(name)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                size += st.st_blocks * 512
    free = shutil.disk_usage(into).free
    if size + VENV_COPY_RESERVE > free:
        raise DeployError(f"not enough room to copy the venv cache {cached}: it needs {size / 1e6:.1f} MB and "
                          f"{VENV_COPY_RESERVE / 1e6:.0f} MB more kept free, and {free / 1e6:.1f} MB is free; free some "
                          "space, or " + ("put the cache on this file system (its hard links were refused)" if linked
                                          else "pass --venv-cache-links"))


def build_venv(release: Path, target: Path, wheelhouse: Path | None) -> str:
    """python3 -m venv + pip install of the lock; `.complete` is left to the caller."""
    run([sys.executable, "-m", "venv", str(target)], "creating the venv")
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
           "--no-input", "-r", str(release / "requirements.lock")]
    if wheelhouse:  # offline: an sdist would need its build backend from an index
        pip += ["--isolated", "--no-index", "--find-links", str(wheelhouse), "--only-binary=:all:"]
    run(pip, "pip install")
    return "built"


def swap_in(p: Paths, new: Path, venv: Path) -> None:
    """Rename `new` to `venv`; an old `venv` is moved aside first (a rename cannot replace a
    non-empty directory) and removed after."""
    old = None
    if venv.exists() or venv.is_symlink():
        old = venv.with_name(f"{venv.name}.old-{secrets.token_hex(4)}")
        os.rename(venv, old)
    os.rename(new, venv)
    p.sync_dir(venv.parent)
    if old is not None:
        remove(old)


def write_pth(venv: Path, p: Paths, contract: types.ModuleType) -> None:
    pth = site_packages(venv) / "sprite_os.pth"
    data = f"{p.lib}\n".encode()
    if not pth.is_file() or pth.read_bytes() != data:
        contract.atomic_write(pth, data, 0o644)


# A variable of the deploying shell a word of whose name (split at `_`) ends with one of these is a
# credential: ANTHROPIC_API_KEY, SPRITE_OS_TOKEN, AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, DATABASE_PASSWORD,
# PGPASSWORD; so is one with a word of CREDENTIAL_NAMES (MYSQL_PWD, SMTP_PASS, SSH_AUTH_SOCK, npm's _auth),
# and one whose value is a URL holding a password (DATABASE_URL, HTTPS_PROXY). Not a setting that counts
# tokens (SPRITE_AGENT_MAX_TOKENS), nor ANTHROPIC_BASE_URL.
CREDENTIAL_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS")
CREDENTIAL_NAMES = {"PASS", "PWD", "AUTH", "COOKIE"}
URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]*:[^/?#@\s]*@")


def is_credential(name: str, value: str) -> bool:
    words = name.upper().split("_")
    return (any(word.endswith(CREDENTIAL_WORDS) for word in words) or bool(CREDENTIAL_NAMES & set(words))
            or URL_PASSWORD.search(value) is not None)


def deploying_env(*, keep_credentials: bool) -> dict[str, str]:
    """The deploying environment for a command that runs the release's code, less PYTHONHOME and PYTHONPATH
    (the caller sets its own). Without `keep_credentials`, for what runs the new release's code before the
    switch (the import check, migrate-v1, install-templates): none of them calls anything that needs a
    credential, and the code they run is not vouched for yet, so the shell's credentials stay out. With it,
    for the restart, whose server needs the proxy's key: all but SPRITE_OS_TOKEN, for the token file is the
    one source, and a stale export in the deploying shell would overwrite the token a --token-file just
    installed."""
    dropped = ("PYTHONHOME", "PYTHONPATH", "SPRITE_OS_TOKEN")
    return {k: v for k, v in os.environ.items()
            if k not in dropped and (keep_credentials or not is_credential(k, v))}


def run_new_code(p: Paths, release: Path, venv_hash: str, *args: str, what: str, echo: tuple[str, ...]) -> None:
    """Run `sprite-os ARGS` with the NEW release's code and venv, before the switch."""
    env = deploying_env(keep_credentials=False)
    env["SPRITE_WORKSPACE"] = str(p.root)
    env["PYTHONPATH"] = str(release / "lib")  # precedes the .pth entry, which still names the old release
    python = p.venvs / venv_hash / "bin" / "python"
    run([str(python), "-P", "-m", "sprite_os", *args], what, env=env, cwd=p.os, echo=echo)


# What `sprite-os serve` imports before it listens: the command entry (`-m sprite_os`), the service
# command and the server; and what the server imports only at the first turn (the agent's SDK), with
# every module of the release compiled (not run): a syntax error in one imported late, a tool or the
# agent, is found now, not by the person's first message. Run by the new release's venv python; on
# failure it prints the traceback (for the log), then one line, what failed (a syntax error named by
# the release's file: src/<file>), and exits 1.
CHECK_SECONDS = 120.0  # the check takes 1 s or so; a minute more is a loaded machine, not an import that ends
START_CHECK = """\
import pathlib, sys, traceback
try:
    import sprite_os, sprite_os.commands.main, sprite_os.commands.service, sprite_os.server, claude_agent_sdk
    for path in sorted(pathlib.Path(sprite_os.__path__[0]).rglob("*.py")):
        compile(path.read_bytes(), str(path), "exec")
except BaseException as exc:
    traceback.print_exc(file=sys.stdout)
    said = str(exc)
    if isinstance(exc, SyntaxError) and exc.filename:
        name = exc.filename.rpartition("/lib/sprite_os/")
        said = f"{exc.msg} ({'src/' + name[2] if name[1] else exc.filename}, line {exc.lineno})"
    print(f"{type(exc).__name__}: {said}".splitlines()[0][:250], flush=True)
    sys.exit(1)
"""


def check_start(p: Paths, release: Path, venv_hash: str, version: str) -> None:
    """The new release's code imports in its own venv as `service start` would run it (the venv's
    python, the release's lib first), before anything runs from it or switches to it: a release that
    matches its MANIFEST but has a syntax error, an import that fails or a dependency missing from its
    venv was switched to, and with no server running (a Sprite asleep) said done, to fail at the next
    start with nothing to roll back to. Nothing is started and no settings are read; the token is not
    in its environment, nor any other credential (deploying_env). An import that blocks (a network
    call at import) is stopped after CHECK_SECONDS:
    the deploy, which holds the deploy lock, is refused rather than hung."""
    env = deploying_env(keep_credentials=False)
    env["PYTHONPATH"] = str(release / "lib")
    python = p.venvs / venv_hash / "bin" / "python"
    try:
        run([str(python), "-P", "-c", START_CHECK], "import check", env=env, cwd=p.os, seconds=CHECK_SECONDS)
    except DeployError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise DeployError(f"release {version} cannot start, nothing switched: {reason}") from None


def run_migrate(p: Paths, release: Path, venv_hash: str) -> None:
    """Schema upgrade and v1 migration."""
    run_new_code(p, release, venv_hash, "migrate-v1", what="migrate-v1", echo=("migrate:",))


def write_templates(p: Paths, release: Path, venv_hash: str, version: str, source: str = "deploy") -> None:
    """soul.md and os.md from the release (the versions they replace stay in .history, a person's
    edit included); the curated files only when missing. The new code does it, so history,
    atomic writes and line limits work exactly as the daemon's."""
    run_new_code(p, release, venv_hash, "install-templates", str(release / "bootstrap" / "templates"),
                 "--source", f"{source}-{version}", what="install-templates", echo=("templates:",))


def restore_templates(p: Paths, version: str) -> None:
    """After switching back to `version`: its own soul.md and os.md, by its own code and venv. A
    failure is reported, not raised: the switch back matters more than the files."""
    release = p.releases / version
    try:
        write_templates(p, release, Path(os.readlink(release / "venv")).name, version, source="rollback")
    except (DeployError, OSError) as exc:
        out.say(f"deploy: warning: could not restore the templates of {version}: {exc}")


def ensure_link(p: Paths, link: Path, target: str) -> None:
    if link.is_symlink():
        if os.readlink(link) != target:
            point(p, link, target)
        return
    if link.exists():  # a real file or folder from an older layout: keep it, out of the way
        keep = p.shared.backup_dir / f"pre-release-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        keep.mkdir(parents=True, exist_ok=True)
        os.rename(link, keep / link.name)
        out.say(f"deploy: moved {link} to {keep / link.name}")
    link.parent.mkdir(parents=True, exist_ok=True)
    point(p, link, target)


def wrapper_script(p: Paths) -> bytes:
    return (
        "#!/bin/sh\n"
        "# The Sprite OS command for this workspace; written by bootstrap/deploy.py. It runs the\n"
        "# current release, e.g. `sprite-os service status`, `sprite-os memory status`.\n"
        "unset PYTHONHOME PYTHONPATH\n"
        f"export SPRITE_WORKSPACE={shlex.quote(str(p.root))}\n"
        f"exec {shlex.quote(str(p.venv / 'bin' / 'python'))} -P -m sprite_os \"$@\"\n"
    ).encode()


def ensure_links(p: Paths, contract: types.ModuleType) -> None:
    ensure_link(p, p.src, "current/src")
    ensure_link(p, p.venv, "current/venv")
    ensure_link(p, p.version, "current/VERSION")
    ensure_link(p, p.lib / "sprite_os", "../src")
    p.bin.mkdir(exist_ok=True)
    data = wrapper_script(p)
    if not p.command.is_file() or p.command.read_bytes() != data:
        contract.atomic_write(p.command, data, 0o755)


def install_token(p: Paths, source: Path, contract: types.ModuleType) -> bool:
    """Install Bridge's token as .os/token (0600), if the release's rule allows it. Returns whether it changed."""
    try:
        token = source.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DeployError(f"cannot read token file {source}: {exc}") from None
    if problem := contract.token_problem(token):
        raise DeployError(f"token in {source} {problem}")
    try:
        same = p.shared.token_file.read_text().strip() == token and p.shared.token_file.stat().st_mode & 0o077 == 0
    except OSError:
        same = False
    if not same:
        contract.atomic_write(p.shared.token_file, (token + "\n").encode(), 0o600)
    return not same


def server_pid(p: Paths) -> int | None:
    """The pid of this workspace's running server (from the service's pid file), or None."""
    try:
        pid = int(p.shared.pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if b"sprite_os" in cmdline and state != "Z" else None


def releases_in_use(pid: int | None) -> set[str]:
    """Releases the running server imports from (its PYTHONPATH names .os/releases/<V>/lib): the name after
    the last `releases` in the path, not the first, which may be a folder the workspace is in."""
    if pid is None:
        return set()
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return set()
    used = set()
    for entry in environ:
        if entry.startswith(b"PYTHONPATH="):
            for part in entry[len(b"PYTHONPATH="):].decode(errors="replace").split(":"):
                parts = Path(part).parts[:-1]  # releases/<V>, its lib left out
                if "releases" in parts[:-1]:
                    used.add(parts[len(parts) - 1 - parts[::-1].index("releases") + 1])
    return used


def restart_service(p: Paths) -> None:
    run([str(p.command), "service", "restart"], "service restart", env=deploying_env(keep_credentials=True),
        cwd=p.os, echo=("sprite-os:",))


def collect_garbage(p: Paths) -> tuple[list[str], list[str]]:
    keep = releases_kept(p)
    removed_releases, removed_venvs = [], []
    for entry in sorted(p.releases.iterdir()):
        if entry.name not in keep:
            remove(entry)
            removed_releases.append(entry.name)
    used = set()
    for name in keep:
        with contextlib.suppress(OSError):
            used.add(Path(os.readlink(p.releases / name / "venv")).name)
    for entry in sorted(p.venvs.iterdir()) if p.venvs.is_dir() else ():
        if entry.name not in used:
            remove(entry)
            removed_venvs.append(entry.name)
    return removed_releases, removed_venvs


def remove_leftovers(p: Paths) -> None:
    """What a removal cut short left (`<name>.removing-*`: nothing names it, nothing uses it), at a deploy
    that runs no gc (the no-op, a rollback): a venv's hundreds of MB waited for the next real deploy. Under
    the deploy lock; another deploy holding it is left to its own gc. Never a kept release: one deployed
    under a version holding `.removing-` (before check_version refused one) is a release, not debris. A
    tidy-up: one it cannot make fails nothing. Only what is gone is said removed, and what could not be is said
    so; a look it cannot make at all (a read-only .os, a lock it cannot open, another deploy holding it) is
    said in deploy.log when one is open (a rollback's; the no-op deploy opens none)."""
    try:
        with deploy_lock(p):
            kept = releases_kept(p)
            for folder in (p.releases, p.venvs):
                for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
                    if REMOVING in entry.name and not (folder == p.releases and entry.name in kept):
                        try:
                            shutil.rmtree(entry)
                        except OSError as exc:
                            out.say(f"deploy: could not remove {entry.relative_to(p.os)} (a removal cut short): {exc}")
                        else:
                            out.say(f"deploy: removed {entry.relative_to(p.os)} (a removal cut short)")
    except (DeployError, OSError) as exc:
        out.log(f"deploy: what a removal cut short left is not looked for: {exc}")


@contextlib.contextmanager
def deploy_lock(p: Paths) -> Iterator[None]:
    p.shared.make_os_dir()
    fd = os.open(p.shared.deploy_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DeployError(f"another deploy is running in {p.root} (lock: {p.shared.deploy_lock})") from None
        yield
    finally:
        os.close(fd)


def check_owner(p: Paths, euid: int) -> None:
    """Root must not write into a workspace someone else owns: what it creates would be root's.
    Judged by the nearest existing one of .os, the workspace, or a parent of it."""
    if euid != 0:
        return
    for path in (p.os, p.root, *p.root.parents):
        with contextlib.suppress(FileNotFoundError):
            uid = path.stat().st_uid
            if uid != 0:
                raise DeployError(f"run the deploy as the owner of {path} (uid {uid}), not as root")
            return


def prepare(p: Paths) -> None:
    p.shared.make_os_dir()  # .os and its private folders, with the modes the release defines
    for path in (p.releases, p.venvs):
        path.mkdir(exist_ok=True)


def agent_user(contract: types.ModuleType, version: str) -> tuple[str, int, int, Path] | None:
    """The agent's own user (SPRITE_AGENT_USER, default sprite-agent), created if missing: right
    after staging, before anything is switched, so that a name that is a service's or a person's
    (refused: the agent would get its files, and every start would kill its processes) changes
    nothing. Not root: None (the server then uses the CLI's sandbox, docs/security.md)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("SPRITE_AGENT_USER", "").strip() or contract.AGENT_USER
    try:
        uid, gid, home = contract.ensure_agent_user(name)
    except contract.AgentUserRefused as exc:
        raise DeployError(str(exc)) from None
    step("agent-user", version, agent_user=name, uid=uid)
    return name, uid, gid, home


def isolate(p: Paths, contract: types.ModuleType, version: str, agent: tuple[str, int, int, Path] | None) -> None:
    """The agent's CLI runs as its own user: give the workspace the owners and modes that keep it
    out of .os/ (fixing those of an existing Sprite), and make the kernel refuse hard links to files
    it can't write, now and at every boot. Not root: nothing to do."""
    if agent is None:
        step("isolate", version, skipped="not-root")
        return
    name, uid, gid, home = agent
    step("isolate", version, agent_user=name, uid=uid)
    contract.apply_ownership(p.root, uid, gid, deep=True)
    changed = contract.ensure_sysctls()
    conf = "".join(f"{key} = {value}\n" for key, value in contract.SYSCTLS.items())
    with contextlib.suppress(OSError):  # a read-only /etc (some containers): the running kernel has them
        if not SYSCTL_CONF.is_file() or SYSCTL_CONF.read_text() != conf:
            contract.atomic_write(SYSCTL_CONF, conf.encode(), mode=0o644)
    if changed:
        out.say(f"deploy: sysctls set {','.join(changed)}")
    out.log(f"agent home {home}")


def make_user_space(p: Paths, contract: types.ModuleType) -> None:
    contract.make_user_space(p.root)


# ---------------------------------------------------------------- commands


def deploy(args: argparse.Namespace, p: Paths) -> int:
    started = time.monotonic()
    source: Checkout | Tarball = Tarball(Path(args.release)) if args.release else Checkout(Path(args.from_checkout))
    version = source.version()
    if not args.force and already_at(p, version):
        return stay_at(args, p, version, source)
    p.use(source.contract())
    prepare(p)
    out.open_log(p.shared.logs_dir / "deploy.log")
    with deploy_lock(p):
        previous = release_name(p.current)
        if previous and ".partial-" in previous:  # a --force re-stage was killed half-way
            previous = previous.split(".partial-")[0]
        step("stage", version, previous=previous or "none")
        release, contract = stage_release(p, source, version, args.force)
        p.use(contract)
        agent = agent_user(contract, version)
        # Judged by the staged release's rule, as its server will judge it: so after staging, not before.
        if args.token_file:
            install_token(p, Path(args.token_file), contract)
        make_user_space(p, contract)

        step("venv", version)
        venv_hash, how = ensure_venv(p, release, contract, Path(args.wheelhouse) if args.wheelhouse else None,
                                     Path(args.venv_cache) if args.venv_cache else None, args.venv_cache_links)
        out.say(f"deploy: venv={venv_hash} {how}")

        step("check", version)
        try:
            check_start(p, release, venv_hash, version)
        except DeployError:
            # Not kept for reuse (a release rebuilt under its version is staged afresh), unless in use; a
            # kept release re-staged by --force is still its staged copy, the kept one untouched.
            if ".partial-" in release.name or version not in releases_kept(p):
                remove(release)
            raise
        if ".partial-" in release.name:
            release = replace_kept(p, release, version)

        step("migrate", version)
        run_migrate(p, release, venv_hash)

        step("templates", version)
        write_templates(p, release, venv_hash, version)

        step("switch", version)
        old_previous = release_name(p.previous)
        if previous and previous != version:
            point(p, p.previous, f"releases/{previous}")
        os.sync()  # everything staged is on disk before `current` names it
        point(p, p.current, f"releases/{version}")

        step("links", version)
        ensure_links(p, contract)
        isolate(p, contract, version, agent)

        pid = server_pid(p)
        if pid is None or args.no_restart:
            step("restart", version, skipped="not-running" if pid is None else "no-restart")
        else:
            step("restart", version, pid=pid)
            try:
                restart_service(p)
            except DeployError as exc:
                if not previous or previous == version:
                    raise
                point(p, p.current, f"releases/{previous}")
                if old_previous:
                    point(p, p.previous, f"releases/{old_previous}")
                out.say(f"deploy: {version} did not start; rolling back to {previous}")
                restore_templates(p, previous)
                try:
                    restart_service(p)
                except DeployError as again:  # the service is down: say both, and what is current
                    raise DeployError(f"{exc}; rolled back to {previous}, which did not start either "
                                      f"({again}): nothing is serving") from None
                raise DeployError(f"{exc}; rolled back to {previous}") from None

        step("gc", version)
        releases, venvs = collect_garbage(p)
        if releases or venvs:
            out.say(f"deploy: removed releases={','.join(releases) or 'none'} venvs={','.join(venvs) or 'none'}")
    out.say(f"deploy: done version={version} seconds={time.monotonic() - started:.1f}")
    return 0


def stay_at(args: argparse.Namespace, p: Paths, version: str, source: Checkout | Tarball) -> int:
    """`version` is current and complete: nothing to do but install a new token, and restart a
    running server for it. The token is judged by the rule of that release, which is staged and
    serving. Of the source only its MANIFEST is read (a tarball's first blocks): a release rebuilt
    under the same version is refused, not said to be deployed while the old one serves."""
    if differs(p.current, source):
        raise DeployError(f"this release of {version} is not the {version} deployed (its {MANIFEST} differs): "
                          "a rebuilt release needs a new VERSION, or deploy it with --force")
    contract = load_contract(p.current / "src")
    p.use(contract)
    changed = bool(args.token_file) and install_token(p, Path(args.token_file), contract)
    out.say(f"deploy: already at {version}")
    remove_leftovers(p)
    if changed:
        out.say("deploy: token installed")
        if server_pid(p) is not None and not args.no_restart:
            with deploy_lock(p):
                restart_service(p)
    return 0


def rollback(args: argparse.Namespace, p: Paths) -> int:
    if not p.current.is_symlink():
        raise DeployError(f"nothing is deployed in {p.root}")
    # The facts of the release rolled back from: its deploy.py is the one to run (docs/deploy.md),
    # so script and facts match. Loaded before anything changes.
    contract = load_contract(p.current / "src")
    p.use(contract)
    out.open_log(p.shared.logs_dir / "deploy.log")
    with deploy_lock(p):
        current, previous = release_name(p.current), release_name(p.previous)
        if not previous or previous == current or not is_complete_release(p.releases / previous):
            raise DeployError(f"no previous release to roll back to in {p.releases}")
        if not venv_usable(p.releases / previous / "venv", deploying_python()):
            # Switched to, it could not run, not even the command that restarts it.
            raise DeployError(f"the previous release {previous} cannot run: its venv's python is gone or not "
                              f"{deploying_python()} (the system python changed); deploy its tarball again, "
                              "which rebuilds the venv")
        if (damage := venv_damage(p.releases / previous / "venv")) is not None:
            raise DeployError(f"the previous release {previous} cannot run: its venv is damaged ({damage} is missing); "
                              "deploy its tarball again, which rebuilds the venv")
        out.say(f"deploy: rollback from={current} to={previous}")
        os.sync()
        if current:
            point(p, p.previous, f"releases/{current}")
        point(p, p.current, f"releases/{previous}")
        ensure_links(p, contract)
        restore_templates(p, previous)
        if server_pid(p) is not None and not args.no_restart:
            restart_service(p)
    remove_leftovers(p)
    out.say(f"deploy: done version={previous}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deploy.py", description="Deploy a Sprite OS release into a workspace.")
    parser.add_argument("--workspace", default=os.environ.get("SPRITE_WORKSPACE") or "/workspace",
                        help="workspace root (default: $SPRITE_WORKSPACE or /workspace)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--release", metavar="TARBALL", help="a release built by `make dist`")
    what.add_argument("--from-checkout", metavar="DIR", help="a Sprite OS source checkout")
    what.add_argument("--rollback", action="store_true", help="switch back to the previous release")
    parser.add_argument("--wheelhouse", metavar="DIR", help="install the venv from these wheels only (no index)")
    parser.add_argument("--venv-cache", metavar="DIR", help="copy DIR/<H> instead of pip-installing, if complete")
    parser.add_argument("--venv-cache-links", action="store_true",
                        help="hard-link the cached venv instead of copying it (same filesystem; never modify the "
                             "cache in place afterwards)")
    parser.add_argument("--token-file", metavar="F", help="install F's content as .os/token (mode 0600)")
    parser.add_argument("--force", action="store_true", help="redeploy even if this version is current")
    parser.add_argument("--no-restart", action="store_true", help="leave a running server as it is")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    p = Paths(Path(os.path.abspath(os.path.expanduser(args.workspace))))
    try:
        check_owner(p, os.geteuid())  # before anything writes, the token and the no-op path included
        return rollback(args, p) if args.rollback else deploy(args, p)
    except DeployError as exc:
        out.log(f"error: {exc}")
        print(f"deploy: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        out.log(f"error: {exc}")
        print(f"deploy: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
