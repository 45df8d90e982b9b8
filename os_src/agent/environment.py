"""The environment the agent's CLI gets, and with it everything the agent runs.

The agent can read all of it (`printenv`, /proc/$PPID/environ), so it holds no secret: the
model is reached through the server's relay (agent/model_relay.py) with a key that opens only that.
The SDK always starts the CLI with the server's whole environment under `ClaudeAgentOptions.env`
(it cannot drop a variable), so `cli_environment` blanks every inherited variable that is not
on the allow-list below: what a shell and the tools need (PATH, locale, proxies, CA files) and
the CLI's own tuning (`CLAUDE_CODE_*`), never a name that looks like a credential.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Offline-safe, no telemetry, MCP tools listed directly (not deferred behind ToolSearch), and no
# path by which the CLI writes memory itself.
CLI_SETTINGS = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "ENABLE_TOOL_SEARCH": "false",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    "DISABLE_AUTOUPDATER": "1",
}

_PASSED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM",
    "NO_COLOR", "TMPDIR", "HOSTNAME",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE",
})
_PASSED_PREFIXES = ("LC_", "XDG_", "CLAUDE_CODE_")
_SECRET_SHAPED = re.compile(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH|COOKIE)(_|$)", re.IGNORECASE)


def passed_through(name: str) -> bool:
    """Whether the CLI may inherit the server's value of `name`."""
    if _SECRET_SHAPED.search(name):
        return False
    return name in _PASSED or name.startswith(_PASSED_PREFIXES)


def cli_environment(inherited: Mapping[str, str], settings: Mapping[str, str]) -> dict[str, str]:
    """`ClaudeAgentOptions.env` for a CLI started from a process whose environment is `inherited`:
    every variable not passed through is blanked, then `settings` (the relay, CLI_SETTINGS) set."""
    blanked = {name: "" for name in inherited if not passed_through(name)}
    return {**blanked, **CLI_SETTINGS, **settings}
