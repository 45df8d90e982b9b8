"""`memory import`: past conversations in through transcript.db's writer, bad lines reported and
skipped, idempotent; then `memory rebuild --index` and `memory search --json`, one query or many."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sprite_os.commands.main import main as cli
from sprite_os.memory.importer import BadLine, import_turns, parse, timestamp
from sprite_os.memory.transcript_store import TranscriptDB

LINES = [
    {"session": "v1-a", "timestamp": 1_600_000_000, "user": "We adopted a dog called Biscuit", "assistant": "Lovely!"},
    {"session": "v1-a", "timestamp": "2020-09-13T12:30:00Z", "user": "Biscuit hates the vacuum cleaner"},
    {"session": "v1-b", "timestamp": "2021-03-05T09:00:00", "user": "My PIN is <private>4321</private>, ok?",
     "assistant": None, "tool_calls": [{"name": "Bash", "input": {"command": "ls"}, "output": "a.txt"}]},
]


def jsonl(path: Path, bad: bool = True) -> Path:
    rows = [json.dumps(x) for x in LINES]
    if bad:
        rows[1:1] = ["{not json", json.dumps({"session": "v1-a", "user": "no timestamp"}), ""]
        rows.append(json.dumps({"session": "", "timestamp": 1, "user": "x"}))
        rows.append(json.dumps(["a", "list"]))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_timestamps_are_epoch_seconds_or_iso_8601() -> None:
    assert timestamp(1_600_000_000) == 1_600_000_000.0
    assert timestamp("2020-09-13T12:26:40Z") == 1_600_000_000.0
    assert timestamp("2020-09-13T12:26:40") == 1_600_000_000.0  # no offset: UTC
    assert timestamp("2020-09-13T14:26:40+02:00") == 1_600_000_000.0
    for bad in ("yesterday", True, None, float("nan"), -5, [1]):
        with pytest.raises(BadLine):
            timestamp(bad)


def test_a_line_becomes_a_turn_numbered_within_its_session() -> None:
    numbers: dict[str, int] = {}
    first = parse(json.dumps(LINES[0]), numbers)
    second = parse(json.dumps(LINES[1]), numbers)
    private = parse(json.dumps(LINES[2]), numbers)
    assert (first.session_id, first.sequence_num, second.sequence_num, private.sequence_num) == ("v1-a", 1, 2, 1)
    assert second.agent_response == "" and "4321" not in private.user_message and "[private]" in private.user_message
    assert json.loads(private.tool_calls_json)[0]["name"] == "Bash"
    with pytest.raises(BadLine, match="user must be a string"):
        parse(json.dumps({"session": "s", "timestamp": 1, "user": 5}), numbers)
    assert numbers == {"v1-a": 2, "v1-b": 1}  # a bad line numbers nothing


def test_import_reports_bad_lines_by_number_keeps_the_rest_and_twice_adds_nothing(tmp_path: Path) -> None:
    db = TranscriptDB(tmp_path / "t.db")
    source = jsonl(tmp_path / "past.jsonl").read_text().splitlines()
    report = import_turns(db, source)
    assert (report.added, report.already) == (3, 0)
    assert [n for n, _ in report.bad] == [2, 3, 7, 8]
    assert "not JSON" in report.bad[0][1] and "timestamp is missing" in report.bad[1][1]
    assert [(o.session_id, o.sequence_num) for o in db.iter_all()] == [("v1-a", 1), ("v1-a", 2), ("v1-b", 1)]
    assert all(o.processed == 0 for o in db.iter_all())  # pending: the daemon curates them like any turn
    session = db.session("v1-a")
    assert session is not None and session.ended_at == 1_600_000_200.0 and session.observation_count == 2
    again = import_turns(db, source)
    assert (again.added, again.already) == (0, 3) and db.counts()["total"] == 3


def test_import_rebuild_and_search_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    workspace = tmp_path / "ws"
    (workspace / ".os" / "memory").mkdir(parents=True)
    monkeypatch.setenv("SPRITE_WORKSPACE", str(workspace))
    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    source = jsonl(tmp_path / "past.jsonl")
    assert cli(["memory", "import", str(source)]) == 1  # bad lines: reported, and said by the status
    out = capsys.readouterr()
    assert f"{source}:2: skipped: not JSON" in out.err and f"{source}:8: skipped" in out.err
    assert "imported 3 turns from 2 sessions" in out.out
    assert cli(["memory", "import", str(jsonl(tmp_path / "good.jsonl", bad=False))]) == 0
    assert "imported 0 turns" in capsys.readouterr().out
    assert cli(["memory", "search", "vacuum", "--json"]) == 0  # no index yet: learnings only, nothing found
    assert json.loads(capsys.readouterr().out)["hits"] == []
    assert cli(["memory", "rebuild", "--index", "--yes"]) == 0
    assert "3 turns and 3 documents indexed" in capsys.readouterr().out
    assert cli(["memory", "search", "what does Biscuit hate?", "--json", "--limit", "2"]) == 0
    found = json.loads(capsys.readouterr().out)
    first = found["hits"][0]
    assert len(found["hits"]) == 2 and first["kind"] == "episode" and first["type"] == "EPISODE"
    assert first["source"] == {"session": "v1-a", "turn": 2, "observation_id": 2}
    assert first["date"] == "2020-09-13T12:30:00Z" and "vacuum" in first["snippet"] and first["score"] > 0
    queries = ["vacuum", "", "PIN", json.dumps({"query": "what happened in September 2020?", "now": 1_650_000_000})]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(queries) + "\n"))
    assert cli(["memory", "search", "-", "--json"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [a["query"] for a in answers] == ["vacuum", "", "PIN", "what happened in September 2020?"]
    assert answers[0]["hits"][0]["source"]["turn"] == 2 and answers[1]["hits"] == []
    assert "4321" not in json.dumps(answers[2])  # private text never reached the index or the snippets
    assert {h["source"]["session"] for h in answers[3]["hits"][:2]} == {"v1-a"}
    assert cli(["memory", "status", "--json"]) == 0
    recall = json.loads(capsys.readouterr().out)["recall"]
    assert recall["episodes"] == 3 and recall["index_documents"] == 3
    assert not recall["dense"]["available"] and "off" in recall["dense"]["detail"]
