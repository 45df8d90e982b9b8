"""Settings: environment, then flags; a bad setting fails at start with one clear line."""

import os
import stat
from pathlib import Path

import pytest

from sprite_os.commands.main import main
from sprite_os.config import DEFAULT_BATCH_TOKENS, describe, load_settings, resolve_token
from sprite_os.errors import ConfigError
from sprite_os.memory.curation.curator import MIN_BATCH_TOKENS


def test_defaults_and_environment(tmp_path: Path) -> None:
    defaults = load_settings({})
    assert (defaults.port, defaults.workspace, defaults.host) == (8765, Path("/workspace"), "127.0.0.1")
    # The design's batch of about 25 turns, curated by a small Haiku model.
    assert defaults.memory_batch_turns == 25 and defaults.memory_model.startswith("claude-haiku")
    s = load_settings({"SPRITE_WORKSPACE": str(tmp_path), "SPRITE_OS_PORT": "9001", "SPRITE_MEMORY_BATCH_TURNS": "5",
                       "ANTHROPIC_BASE_URL": "http://bridge:8080", "SPRITE_LOG_FORMAT": "json"})
    assert (s.workspace, s.port, s.memory_batch_turns, s.log_format) == (tmp_path, 9001, 5, "json")
    assert s.model_env() == {"ANTHROPIC_API_KEY": "sprite-os", "ANTHROPIC_BASE_URL": "http://bridge:8080"}


def test_the_curators_budget_and_token_cap() -> None:
    defaults = load_settings({})
    # A dollar a day, and a cap that holds a full 25-turn batch beside full files (test_budget).
    assert (defaults.memory_daily_budget_usd, defaults.memory_batch_tokens) == (1.0, DEFAULT_BATCH_TOKENS)
    s = load_settings({"SPRITE_MEMORY_DAILY_BUDGET_USD": "0.25", "SPRITE_MEMORY_BATCH_TOKENS": str(MIN_BATCH_TOKENS)})
    assert (s.memory_daily_budget_usd, s.memory_batch_tokens) == (0.25, MIN_BATCH_TOKENS)
    assert load_settings({"SPRITE_MEMORY_DAILY_BUDGET_USD": "$3"}).memory_daily_budget_usd == 3.0


def test_port_0_is_any_free_port_for_serve() -> None:
    assert load_settings({"SPRITE_OS_PORT": "0"}).port == 0  # the service refuses it (test_service)


def test_flags_override_environment(tmp_path: Path) -> None:
    s = load_settings({"SPRITE_OS_PORT": "9001"}).with_overrides(port=9002, host=None)
    assert s.port == 9002 and s.host == "127.0.0.1"


@pytest.mark.parametrize(("env", "needle"), [
    ({"SPRITE_OS_PORT": "abc"}, "SPRITE_OS_PORT must be a whole number"),
    ({"SPRITE_OS_PORT": "70000"}, "SPRITE_OS_PORT must be from 1 to 65535 (or 0 for any free port), got 70000"),
    ({"SPRITE_OS_PORT": "-1"}, "from 1 to 65535 (or 0 for any free port), got -1"),
    ({"SPRITE_MEMORY_BATCH_TURNS": "0"}, "SPRITE_MEMORY_BATCH_TURNS must be greater than 0"),
    ({"SPRITE_MEMORY_DAILY_BUDGET_USD": "a dollar"}, "SPRITE_MEMORY_DAILY_BUDGET_USD must be an amount of US dollars"),
    *[({"SPRITE_MEMORY_DAILY_BUDGET_USD": bad}, "SPRITE_MEMORY_DAILY_BUDGET_USD must be an amount of US dollars "
       f"greater than 0 (and finite), got {bad}") for bad in ("0", "-1", "nan", "inf")],
    ({"SPRITE_MEMORY_BATCH_TOKENS": "lots"}, "SPRITE_MEMORY_BATCH_TOKENS must be a whole number"),
    ({"SPRITE_MEMORY_BATCH_TOKENS": "0"}, "SPRITE_MEMORY_BATCH_TOKENS must be greater than 0"),
    ({"SPRITE_IDLE_TIMEOUT": "soon"}, "SPRITE_IDLE_TIMEOUT must be a number"),
    ({"ANTHROPIC_BASE_URL": "bridge:8080"}, "ANTHROPIC_BASE_URL must be an http(s) URL"),
    ({"SPRITE_OS_TOKEN": "short"}, "at least 16"),
    ({"SPRITE_OS_TOKEN": "has a space in it 123"}, "without spaces"),
    ({"SPRITE_LOG_FORMAT": "xml"}, "SPRITE_LOG_FORMAT"),
    ({"SPRITE_LOG_LEVEL": "loud"}, "SPRITE_LOG_LEVEL"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_command_line_reports_bad_setting_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPRITE_OS_PORT", "abc")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sprite-os: error: SPRITE_OS_PORT")


@pytest.mark.parametrize("workspace", [["--workspace", "{f}"], ["--workspace={f}"]])
def test_the_workspace_flag_goes_with_the_default_command(
        tmp_path: Path, workspace: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`sprite-os --workspace W --port P` is `serve` in W: the flag is the command line's own, before
    the command, and it used to be put after the `serve` it implies, where argparse refused it."""
    f = tmp_path / "file"
    f.write_text("x")  # a workspace that is a file: refused by the settings, before any server starts
    assert main([w.format(f=f) for w in workspace] + ["--port", "0"]) == 2
    assert capsys.readouterr().err == f"sprite-os: error: SPRITE_WORKSPACE is not a directory: {f}\n"


def test_a_curator_cap_too_small_for_one_turn_fails_the_start_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The floor is the curator's (the largest prompt without turns, plus one turn): the memory
    system checks it when it is built, before the server listens."""
    monkeypatch.setenv("SPRITE_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("SPRITE_OS_PORT", "0")
    monkeypatch.setenv("SPRITE_MEMORY_BATCH_TOKENS", str(MIN_BATCH_TOKENS - 1))
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err == (f"sprite-os: error: SPRITE_MEMORY_BATCH_TOKENS must be at least {MIN_BATCH_TOKENS} (the largest "
                   f"prompt without turns, plus one turn), got {MIN_BATCH_TOKENS - 1}\n")


def test_workspace_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        load_settings({"SPRITE_WORKSPACE": str(f)})


def test_token_file_is_created_private_and_reused(tmp_path: Path) -> None:
    s = load_settings({"SPRITE_WORKSPACE": str(tmp_path)})
    with pytest.raises(ConfigError, match="no token"):
        resolve_token(s, create=False)
    token = resolve_token(s, create=True)
    path = s.layout.token_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert resolve_token(s, create=False) == token and len(token) >= 32


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    s = load_settings({"SPRITE_WORKSPACE": str(tmp_path)})
    s.layout.os_dir.mkdir(parents=True)
    s.layout.token_file.write_text("0123456789abcdef0123\n")
    os.chmod(s.layout.token_file, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        resolve_token(s, create=False)


def test_environment_token_wins_and_secrets_are_never_described(tmp_path: Path) -> None:
    s = load_settings({"SPRITE_WORKSPACE": str(tmp_path), "SPRITE_OS_TOKEN": "x" * 20, "ANTHROPIC_API_KEY": "sk-1"})
    assert resolve_token(s, create=False) == "x" * 20
    text = repr(describe(s))
    assert "x" * 20 not in text and "sk-1" not in text and "'token': 'set'" in text
