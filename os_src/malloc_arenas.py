"""One process-wide allocator setting: how many malloc arenas glibc may create.

glibc gives threads that allocate at the same time arenas of their own (up to 8 per core),
and memory freed in one arena is not reused by the others: the server's worker threads
(asyncio.to_thread, the database workers, the embedding runtime) each grow one. Measured
by `make chaos`'s long run (docs/reliability.md): the server's RSS went from 240 MiB at
turn 50 to 410 MiB at turn 500 with glibc's default, and from 220 to 264 MiB with 2
arenas. Call it before any thread starts. An operator's MALLOC_ARENA_MAX stands; where
the C library is not glibc, nothing is done.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """True if glibc took the limit; False if MALLOC_ARENA_MAX is set or there is no mallopt."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
