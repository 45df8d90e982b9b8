"""Rare words are counted against the index as it is now (rarity.py): its document frequencies are kept
between searches only while the index has not changed."""

from __future__ import annotations

from pathlib import Path

from sprite_os.memory.recall.index import RecallIndex, doc_id, learning_doc
from sprite_os.memory.recall.rarity import Rarity

AT = 1_700_000_000.0


def test_a_forget_then_a_capture_of_as_many_documents_counts_the_words_again(tmp_path: Path) -> None:
    """The live document count is the same before and after (two out, two in); "quokka" was in none and
    is now in two, no longer rare among 40 (at most one is). Counts kept on the live count stay stale,
    in the writer's own process and in a reader's."""
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, AT, f"filler words here {i}") for i in range(40))
    writer.commit()
    reader = RecallIndex(tmp_path / "index")
    own, other = Rarity(writer), Rarity(reader)
    assert own.counts(["quokka"]) == other.counts(["quokka"]) == [1]
    before = writer.documents
    writer.put([learning_doc(100, AT, "quokka seen"), learning_doc(101, AT, "a quokka again")],
               replace=[doc_id("learning", 0), doc_id("learning", 1)])
    writer.commit()
    assert writer.documents == before
    assert own.counts(["quokka"]) == [0]
    assert other.counts(["quokka"]) == [0]
    assert other.held(["quokka"])
    writer.close()
