"""Logging: key=value for development, JSON when deployed, a rotated file on a Sprite."""

import json
from pathlib import Path

import pytest

from sprite_os import logs


def test_json_lines_when_deployed(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "sprite-os.log"
    logs.configure_logging("json", "info", log_file)
    logs.get_logger("sprite_os.test").info("turn_started", turn_id="t1", chars=12)
    logs.get_logger("sprite_os.test").debug("hidden", text="user content")  # below the level
    [line] = log_file.read_text().splitlines()
    entry = json.loads(line)
    assert (entry["event"], entry["level"], entry["turn_id"], entry["chars"]) == ("turn_started", "info", "t1", 12)
    assert entry["timestamp"].endswith("Z")


def test_key_value_in_development(tmp_path: Path) -> None:
    log_file = tmp_path / "dev.log"
    logs.configure_logging("kv", "debug", log_file)
    logs.get_logger("sprite_os.test").warning("proxy_down", status=503)
    [line] = log_file.read_text().splitlines()
    assert line.startswith("timestamp=") and "level=warning event=proxy_down" in line and "status=503" in line


def test_the_log_file_is_rotated_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "LOG_FILE_BYTES", 2000)
    log_file = tmp_path / "sprite-os.log"
    logs.configure_logging("json", "info", log_file)
    for i in range(500):
        logs.get_logger("sprite_os.test").info("tick", i=i, pad="x" * 50)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["sprite-os.log", *(f"sprite-os.log.{n}" for n in range(1, logs.LOG_FILE_BACKUPS + 1))]
    assert all(p.stat().st_size <= 2000 for p in tmp_path.iterdir())
    assert json.loads(log_file.read_text().splitlines()[-1])["i"] == 499  # the newest line is in the live file
