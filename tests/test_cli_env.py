"""The CLI's environment (os_src/agent/environment.py): the server's secrets are blanked, a shell's needs pass."""

from __future__ import annotations

from sprite_os.agent.environment import CLI_SETTINGS, cli_environment, passed_through

SERVER_ENV = {
    "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HTTPS_PROXY": "http://proxy:3128",
    "CLAUDE_CODE_MAX_RETRIES": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8000",
    "SPRITE_OS_TOKEN": "server-token", "ANTHROPIC_API_KEY": "proxy-key", "ANTHROPIC_AUTH_TOKEN": "proxy-token",
    "ANTHROPIC_CUSTOM_HEADERS": "x-secret: 1", "CLAUDE_CODE_OAUTH_TOKEN": "oauth", "AWS_SECRET_ACCESS_KEY": "aws",
    "GITHUB_TOKEN": "gh", "DATABASE_URL": "postgres://u:p@db/x", "PYTHONPATH": "/srv", "SPRITE_WORKSPACE": "/workspace",
}
RELAY = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:4000", "ANTHROPIC_API_KEY": "relay-key", "ANTHROPIC_AUTH_TOKEN": ""}


def test_what_a_shell_needs_passes_and_everything_else_is_blanked() -> None:
    env = cli_environment(SERVER_ENV, RELAY)
    kept = {k for k in SERVER_ENV if k not in env}  # never set: inherited from the server as it is
    assert kept == {"PATH", "HOME", "LANG", "LC_ALL", "HTTPS_PROXY", "CLAUDE_CODE_MAX_RETRIES",
                    "CLAUDE_CODE_MAX_OUTPUT_TOKENS"}
    for name in ("SPRITE_OS_TOKEN", "ANTHROPIC_CUSTOM_HEADERS", "CLAUDE_CODE_OAUTH_TOKEN", "AWS_SECRET_ACCESS_KEY",
                 "GITHUB_TOKEN", "DATABASE_URL", "PYTHONPATH", "SPRITE_WORKSPACE"):
        assert env[name] == "", name
    assert env["ANTHROPIC_API_KEY"] == "relay-key" and env["ANTHROPIC_AUTH_TOKEN"] == ""
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4000"
    assert CLI_SETTINGS.items() <= env.items()
    # What the SDK runs the CLI with: the server's environment under these.
    final = {**SERVER_ENV, **env}
    assert not {"server-token", "proxy-key", "proxy-token", "oauth", "aws", "gh"} & set(final.values())


def test_credential_shaped_names_never_pass_even_under_an_allowed_prefix() -> None:
    for name in ("CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_SESSION_ACCESS_TOKEN", "LC_KEY", "XDG_SECRET",
                 "CLAUDE_CODE_API_KEY_HELPER_TTL_MS", "CLAUDE_CODE_AUTH"):
        assert not passed_through(name), name
    for name in ("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "LC_CTYPE", "XDG_RUNTIME_DIR", "no_proxy"):
        assert passed_through(name), name
