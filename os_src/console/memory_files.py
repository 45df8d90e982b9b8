"""The memory files as the console sees them: sizes against limits, history with diffs, a
person's edit, a rollback. Blocking file I/O: the console API runs these in a thread.

A person's edit goes through `MemoryFiles.write` with the source `person-edit` and the
hash of the text the edit began from, so it is exactly what the daemon treats as a
person's edit on disk: a batch that read the file before the edit finds the content
changed and does not overwrite it (see processor.py), and an edit that began before the
daemon's last rewrite is refused instead of silently undoing that rewrite.
"""

from __future__ import annotations

import difflib
import os
from typing import NamedTuple

from ..errors import FileChanged
from ..fsutil import NotDurable
from ..memory.files import MAX_FILE_BYTES, SPECS, MemoryFiles, Version, line_count, sha
from ..text import safe_text
from .memory_frames import FileInfo, RequestFailed, VersionInfo

MAX_HISTORY = 200  # newest versions listed; FileInfo.versions counts them all
PERSON_EDIT = "person-edit"


def spec_of(name: str) -> None:
    if name not in SPECS:
        raise RequestFailed("not_found", f"no memory file {name!r}; the files are {', '.join(SPECS)}")


class Saved(NamedTuple):
    """What an edit or a rollback answers with."""

    file: FileInfo
    version: VersionInfo
    warning: str | None  # saved, but the disk did not confirm it is stored (NotDurable)
    made: bool  # False: the file held this text already (the same request again): no new version, no audit row


def file_info(files: MemoryFiles, name: str, text: str | None = None, versions: int | None = None) -> FileInfo:
    spec = SPECS[name]
    text = files.read(name) if text is None else text
    return FileInfo(
        name=name, owner=spec.owner, editable=spec.owner == "daemon", lines=line_count(text),
        max_lines=spec.max_lines, bytes=len(text.encode()), max_bytes=MAX_FILE_BYTES,
        versions=len(files.history(name)) if versions is None else versions, sha256=sha(text),
    )


def all_files(files: MemoryFiles) -> list[FileInfo]:
    return [file_info(files, name) for name in SPECS]


def version_info(version: Version, text: str | None = None) -> VersionInfo:
    text = version.text if text is None else text
    return VersionInfo(number=version.number, created_at=version.created_at, source=version.source,
                       lines=line_count(text))


def file_detail(files: MemoryFiles, name: str) -> tuple[FileInfo, str, list[VersionInfo]]:
    spec_of(name)
    text = files.read(name)
    history = files.history(name)
    return (file_info(files, name, text, len(history)), text,
            [version_info(v) for v in history[-MAX_HISTORY:]])


def unified_diff(before: str, after: str, before_label: str, after_label: str) -> str:
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), before_label, after_label, lineterm="")
    return "\n".join(lines)


def version_detail(files: MemoryFiles, name: str, number: int) -> tuple[VersionInfo, str, int | None, str]:
    """(the version, its text, the version before it, the diff from that one to this)."""
    spec_of(name)
    history = files.history(name)
    for index, version in enumerate(history):
        if version.number == number:
            text = version.text
            previous = history[index - 1] if index else None
            before = previous.text if previous else ""
            label = f"{name}@{previous.number}" if previous else "(nothing)"
            diff = unified_diff(before, text, label, f"{name}@{number}")
            return version_info(version, text), text, previous.number if previous else None, diff
    raise RequestFailed("not_found", f"{name} has no version {number}")


def edit(files: MemoryFiles, name: str, text: str, base_sha256: str) -> Saved:
    """Save a person's edit of a curated file, if the file is still what the edit began from.
    A Save whose text the file already holds (the same Save again, after an answer that was an
    error) is answered as saved (`made` False), not as changed by someone else."""
    spec_of(name)
    if SPECS[name].owner != "daemon":
        raise RequestFailed("not_editable", f"{name} is written by deploys; change it in a release")
    text = safe_text(text)  # as MemoryFiles.write stores it, so the sha256 returned is the file's
    if text and not text.endswith("\n"):
        text += "\n"
    try:
        version = files.write(name, text, PERSON_EDIT, expect=base_sha256)
    except ValueError as exc:
        raise RequestFailed("over_limit", f"{exc}; nothing was saved") from None
    except FileChanged:
        latest = files.latest_version(name)
        if latest is not None and files.read(name) == text:  # already saved, this very text
            return Saved(file_info(files, name, text), version_info(latest), None, made=False)
        raise RequestFailed("file_changed", f"{name} changed since you began editing ({changed_by(latest)}); "
                            "nothing was saved: reload it and edit again") from None
    except NotDurable as exc:
        return _unconfirmed_save(files, name, exc, text)
    return Saved(file_info(files, name, text), version_info(version, text), None, made=True)


def _unconfirmed_save(files: MemoryFiles, name: str, exc: NotDurable, text: str | None = None) -> Saved:
    """An edit or rollback the file shows, whose name the disk did not confirm: saved, with the warning."""
    saved = files.latest_version(name)
    assert saved is not None  # the version was kept before the file was written
    return Saved(file_info(files, name, text), version_info(saved), unconfirmed(name, saved, exc), made=True)


def unconfirmed(name: str, version: Version, exc: OSError) -> str:
    """What a person is told of a write that happened but that the disk did not confirm."""
    # The error's own text names the server's path: the person is told only what the disk said.
    said = os.strerror(exc.errno) if exc.errno else "unknown"
    return (f"{name} was saved as version {version.number}, but the disk reported an error "
            f"({said}): the change may not survive a power loss")


def changed_by(version: Version | None) -> str:
    """Who made `version`, in words, for a person whose edit it overtook."""
    source = version.source if version is not None else ""
    if source == PERSON_EDIT or source.startswith("rollback"):
        return "saved from another tab or device, or by you in another window"
    if source.startswith(("batch", "rebuild")):
        return "the memory daemon rewrote it"
    if source == "forget":
        return "a forget took text out of it"
    if source == "deploy":
        return "a deploy replaced it"
    return "it was edited on disk"


def rollback(files: MemoryFiles, name: str, number: int) -> Saved:
    """Make version `number` current again, as a new version, answered as `edit` answers: a rollback
    the file shows already (the same click again, after an answer that was an error) is answered as
    done (`made` False) and makes no second version."""
    spec_of(name)
    history = files.history(name)  # listed once: the latest version and the target from the same listing
    latest = history[-1] if history else None
    target = next((v for v in history if v.number == number), None)
    if target is None:
        raise RequestFailed("not_found", f"{name} has no version {number}")
    if latest is not None and latest.source == f"rollback-to-{number}" and files.read(name) == target.text:
        return Saved(file_info(files, name), version_info(latest), None, made=False)
    try:
        version = files.rollback(name, number)
    except KeyError:
        raise RequestFailed("not_found", f"{name} has no version {number}") from None
    except ValueError as exc:
        raise RequestFailed("over_limit", f"{exc}; nothing was changed") from None
    except NotDurable as exc:
        return _unconfirmed_save(files, name, exc)
    return Saved(file_info(files, name), version_info(version), None, made=True)
