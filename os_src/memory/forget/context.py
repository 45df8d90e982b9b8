"""What the current session's context holds of memory, as a forget sees it, and whether it holds a
forget's lines or turns: then the session must be restarted to let go of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .lines import came_from


@dataclass(frozen=True)
class SessionContext:
    """The session's boot prompt (its lines' hashes, and their texts: file lines, turns not yet curated,
    learnings, summaries) and the turns auto-recall brought it (their ids)."""

    booted: frozenset[str] = frozenset()
    booted_lines: tuple[str, ...] = ()
    recalled: frozenset[int] = frozenset()

    def holds(self, lines: set[str], words: set[str], ids: Sequence[int]) -> bool:
        """Whether it holds a forget's lines (`lines`: the file lines the turns' words find), any line most
        of whose words the turns said (`words`), or one of its turns (`ids`)."""
        return (bool(lines & self.booted) or bool(set(ids) & self.recalled)
                or any(came_from(line, words) for line in self.booted_lines))


NOTHING = SessionContext()  # no session, or one whose context holds nothing of memory yet
