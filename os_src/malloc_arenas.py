"""Two process-wide allocator settings: how many malloc arenas glibc may create, and that large
blocks always come from mmap.

glibc gives threads that allocate at the same time arenas of their own (up to 8 per core),
and memory freed in one arena is not reused by the others: the server's worker threads
(asyncio.to_thread, the database workers, the embedding runtime) each grow one. Measured
by `make chaos`'s long run (docs/reliability.md): the server's RSS went from 240 MiB at
turn 50 to 410 MiB at turn 500 with glibc's default, and from 220 to 264 MiB with 2
arenas. Call it before any thread starts. An operator's MALLOC_ARENA_MAX stands; where
the C library is not glibc, nothing is done.

glibc also raises its mmap threshold each time a large block is freed (up to 32 MiB), after which
blocks that size come from the heap, and the heap keeps what is freed: the model relay's request
bodies (up to 8 MiB each, read as they come) then stay in the server's RSS after they are gone. A
fixed threshold keeps every block over 256 KiB in mmap, which goes back to the system when freed
(tests/test_agent_spend_e2e.py: a hostile agent's sixteen slow 32 MiB bodies, 35 MiB over idle).
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
ARENAS = 2
MMAP_THRESHOLD = 256 * 1024


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
    if not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return bool(mallopt(M_ARENA_MAX, arenas))
