"""The person's files on the socket: list a folder, read a file a chunk at a time, download a
whole file in chunks from one opened descriptor, upload a file in chunks (it lands in documents/). Only user space: a path is relative to the workspace root
and never reaches `.os/`, never follows a link (console/user_files.py). docs/protocol.md
documents each frame; requests and answers work as console/requests.py says.

File contents travel as base64 (msgspec encodes `bytes` so), in chunks of at most CHUNK_BYTES,
so that every frame stays under the socket's 1 MiB limit.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .requests import MAX_INT64, Reply, Request

CHUNK_BYTES = 512 * 1024
MAX_TRANSFER_BYTES = 100 * 1024 * 1024  # an upload, or a download, at most

FilePath = Annotated[str, msgspec.Meta(max_length=4096)]
TransferId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Chunk = Annotated[bytes, msgspec.Meta(max_length=CHUNK_BYTES)]


class FilesListRequest(Request, tag="files_list", frozen=True):
    """A folder's entries from `offset` in its order, or just after the entry `after` (a name, a folder's
    when `after_folder`: the last of the page before); `path` "" is the top of the person's files."""

    path: FilePath = ""
    offset: Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)] = 0
    after: FilePath | None = None
    after_folder: bool = False


class FileReadRequest(Request, tag="file_read", frozen=True):
    path: FilePath
    offset: Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)] = 0
    length: Annotated[int, msgspec.Meta(ge=1, le=CHUNK_BYTES)] = CHUNK_BYTES


class UploadStartRequest(Request, tag="upload_start", frozen=True):
    """A file to upload to documents/: its name (as the person's browser gives it) and size."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    size: Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)]


class UploadChunkRequest(Request, tag="upload_chunk", frozen=True):
    """The next bytes of an upload: `offset` must be what was received so far."""

    upload_id: TransferId
    offset: Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)]
    data: Chunk


class UploadFinishRequest(Request, tag="upload_finish", frozen=True):
    """Every byte was sent: check the size (and `sha256`, if given) and put the file in documents/."""

    upload_id: TransferId
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] | None = None


class UploadCancelRequest(Request, tag="upload_cancel", frozen=True):
    upload_id: TransferId


class DownloadStartRequest(Request, tag="download_start", frozen=True):
    """Open a file to download: it is read from this one opening to the end, whatever is done to
    its path meanwhile (renamed, replaced, swapped for a link)."""

    path: FilePath


class DownloadChunkRequest(Request, tag="download_chunk", frozen=True):
    """The bytes of an open download from `offset` (at most `chunk_bytes`); asking again for the
    same offset gets the same bytes."""

    download_id: TransferId
    offset: Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)]


class DownloadCancelRequest(Request, tag="download_cancel", frozen=True):
    download_id: TransferId


AnyFilesRequest = (FilesListRequest | FileReadRequest | UploadStartRequest | UploadChunkRequest
                   | UploadFinishRequest | UploadCancelRequest | DownloadStartRequest | DownloadChunkRequest
                   | DownloadCancelRequest)


class FileEntry(msgspec.Struct, frozen=True):
    name: str
    kind: str  # file | folder | link | other: a link is listed, never followed
    size: int  # bytes, for a file
    modified: float
    # False: the name on disk is not valid UTF-8; `name` shows it with U+FFFD in place of each bad
    # byte, so it can't be opened, listed into or downloaded by that name (rename it on the Sprite)
    openable: bool = True


class FilesListResult(Reply, tag="files_list_result", frozen=True):
    path: str
    entries: list[FileEntry]  # folders first, then by name
    total: int  # entries in the folder; more than listed when it holds over 2,000
    rest: int = 0  # entries after those listed, in the folder's order (the next: `after` the last listed)


class FileReadResult(Reply, tag="file_read_result", frozen=True):
    path: str
    offset: int
    size: int  # the whole file's
    data: bytes
    eof: bool


class UploadStartResult(Reply, tag="upload_start_result", frozen=True):
    upload_id: str
    chunk_bytes: int  # send chunks of at most this many bytes
    max_bytes: int


class UploadChunkResult(Reply, tag="upload_chunk_result", frozen=True):
    upload_id: str
    received: int


class UploadFinishResult(Reply, tag="upload_finish_result", frozen=True):
    path: str  # where it landed: documents/<name>, or "<name> (2)" and so on beside a file of that name
    size: int


class UploadCancelResult(Reply, tag="upload_cancel_result", frozen=True):
    upload_id: str


class DownloadStartResult(Reply, tag="download_start_result", frozen=True):
    download_id: str
    name: str  # the file's name, to save it by
    size: int  # bytes, as the file was when it was opened: the download is exactly this many
    chunk_bytes: int  # each download_chunk answers at most this many


class DownloadChunkResult(Reply, tag="download_chunk_result", frozen=True):
    download_id: str
    offset: int
    data: bytes
    eof: bool  # the last chunk: the download is finished (and closed 30 s later: this chunk can be asked again)


class DownloadCancelResult(Reply, tag="download_cancel_result", frozen=True):
    download_id: str


AnyFilesReply = (FilesListResult | FileReadResult | UploadStartResult | UploadChunkResult | UploadFinishResult
                 | UploadCancelResult | DownloadStartResult | DownloadChunkResult | DownloadCancelResult)
