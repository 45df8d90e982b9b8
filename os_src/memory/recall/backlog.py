"""Work that goes newest first: which turn ids a pass has seen, as a few disjoint ranges.

The indexer (turns into episodes and index documents) and the embedder (episodes into
vectors) both walk transcript.db's ids from the newest down, so the turns a person is most
likely to ask about are searchable first, and a turn recorded meanwhile jumps the queue: each
step takes the highest ids not yet seen. Ids only grow (transcript.db is append-only, a new
turn's id is above every other), so what has been seen stays a handful of ranges: the
backlog's walk down from where it started, and what arrived above it since.

Pure: the ranges are values, kept by their owner (the index's marks in memory.db's `meta`,
the embedder's in memory).
"""

from __future__ import annotations

from collections.abc import Sequence

Range = tuple[int, int]  # inclusive


def normalise(ranges: Sequence[Sequence[int]]) -> list[Range]:
    """Sorted, disjoint, adjacent ranges joined; empty or inverted ones dropped."""
    out: list[Range] = []
    for lo, hi in sorted((int(r[0]), int(r[1])) for r in ranges if len(r) == 2 and r[0] <= r[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def mark(ranges: Sequence[Range], lo: int, hi: int) -> list[Range]:
    """`ranges` with [lo, hi] seen too."""
    return normalise([*ranges, (lo, hi)])


def highest_gap(ranges: Sequence[Range], top: int) -> Range | None:
    """The highest run of ids in [1, top] not seen yet (the next work, newest first), or None."""
    hi = top
    for lo_seen, hi_seen in reversed(normalise(ranges)):
        if hi_seen < hi:
            return max(hi_seen + 1, 1), hi
        hi = min(hi, lo_seen - 1)
        if hi < 1:
            return None
    return (1, hi) if hi >= 1 else None


def unseen(ranges: Sequence[Range], top: int) -> int:
    """How many ids in [1, top] are not seen yet (an upper bound on the work left: ids may have no turn)."""
    covered = sum(min(hi, top) - max(lo, 1) + 1 for lo, hi in normalise(ranges) if lo <= top and hi >= 1)
    return max(0, top - covered)


COARSE = 2  # the backlog's first pass embeds every COARSE-th turn of a session


def first_pass(turn: int, last_turn: int) -> bool:
    """Is a session's `turn` (of `last_turn`) embedded in the backlog's first pass? A vector holds its turn
    and what the person said in the turn before (episodes.embed_text), so a first pass over every other
    turn, counted from the session's last, puts every turn's words in some vector half-way through: the
    last turn is in it (no turn after it holds its words), and so is turn 1 or turn 2. The second pass
    embeds the rest."""
    return (last_turn - turn) % COARSE == 0
