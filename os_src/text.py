"""Text from the CLI made safe to send and to store. Both the wire format and capture use it."""

from __future__ import annotations

from typing import Any


def clean_text(text: str) -> str:
    """Text that encodes as UTF-8. JSON from the CLI may carry lone surrogates (legal as JSON
    escapes, not in UTF-8); they would fail both the wire encoding and SQLite."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def clean_json(value: Any) -> Any:
    """clean_text applied to every string in a JSON-like value."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value
