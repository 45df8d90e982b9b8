"""Text made safe to send and to store.

`clean_text` is for what the CLI says (the wire format and capture): valid UTF-8, nothing
else changed. `safe_text` is stricter, for everything that reaches a memory file or the
boot prompt, whoever wrote it (the curator model, a person's edit, a migration).
`strip_private` keeps what a person marks <private> out of everything stored.
`estimate_tokens` is how every budget in tokens (the curator's cap, auto-recall's share, the
console's figures) reckons text before a model has seen it.
"""

from __future__ import annotations

import re
import time
from typing import Any

# English prose; denser text (code, tables, other languages) costs more tokens, and what a proxy
# bills is its own count: this is an estimate, rounded up.
CHARS_PER_TOKEN = 4

_PRIVATE = re.compile(r"<private>.*?(?:</private>|\Z)", re.DOTALL | re.IGNORECASE)
_NEWLINES = re.compile(r"\r\n?")
# C0 controls but tab and newline (CR is made a newline first), and lone surrogates.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f]|[\ud800-\udfff]")


def estimate_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def strip_private(text: str) -> str:
    """Text inside <private>...</private> is never stored (an unclosed tag hides the rest)."""
    return _PRIVATE.sub("[private]", text)


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


def safe_text(text: str) -> str:
    """Plain text for a memory file or the boot prompt: valid UTF-8 (a lone surrogate becomes
    U+FFFD), CR LF and lone CR as newlines, and no NUL or other C0 control but tab and newline.

    The boot prompt goes to the CLI as a command-line argument, where one NUL byte fails every
    session start (`embedded null byte`); a lone surrogate fails any UTF-8 encoding of it."""
    if "\r" in text:
        text = _NEWLINES.sub("\n", text)
    return _UNSAFE.sub(_replacement, text)


def _replacement(match: re.Match[str]) -> str:
    return "\ufffd" if match.group() >= "\ud800" else ""


def utc(ts: float, fmt: str) -> str:
    """Epoch seconds as UTC text in `fmt`, or "?" for a time no calendar holds: a row written before
    timestamps were checked (1e17 fails gmtime with EOVERFLOW, 1e30 with OverflowError, NaN with
    ValueError) must not stop search, the daemon or the boot prompt."""
    try:
        return time.strftime(fmt, time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return "?"
