"""Dev mode (what `make run` runs): Sprite OS on a local workspace, with the embedded mock
Bridge's demo model and demo curator as its model proxy, unless ANTHROPIC_BASE_URL names one.

    python -m devkit.dev_mode [--workspace W] [--host H] [--port P]    (from the checkout's root)

Dev mode is the checkout's, not the product's: it is not in the wheel, and the `sprite-os`
command a Sprite runs never imports it.

Settings come from the environment as for `serve`, with defaults of its own so a newcomer
sees memory work within a minute: the workspace is ./.workspace, and memory is curated every 3
turns (and, as always, when a session ends). The workspace is shaped like /workspace (`.os/`
inside); the release's templates are installed into it as a deploy would, and its token is
created on first run and printed, with how to talk to the server.

Its isolation is the CLI's sandbox where it can run, else none, whatever the host has: `user`
isolation gives the workspace to the agent's user (root:<user>, 1770), which a checkout's folder
should not undergo unasked, so dev mode takes it only from SPRITE_ISOLATION. The banner says
which, why, and what it changed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sprite_os.commands.main import guarded, settings_from
from sprite_os.config import Settings, resolve_token
from sprite_os.errors import SpriteOSError
from sprite_os.logs import configure_logging
from sprite_os.memory.files import install_templates

if TYPE_CHECKING:
    from sprite_os.server import SpriteOS

DEV_DEFAULTS = {"SPRITE_WORKSPACE": ".workspace", "SPRITE_MEMORY_BATCH_TURNS": "3"}
TEMPLATES = Path(__file__).resolve().parents[1] / "bootstrap" / "templates"  # in a checkout
INSTALL_HINT = "install it with `pip install -e '.[dev]'` in the checkout (make run does), or set ANTHROPIC_BASE_URL"


class DevExtraMissing(SpriteOSError):
    """Dev mode's mock model needs the `dev` extra (aiohttp), and it is not installed."""

    exit_code = 2


def dev_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` over dev mode's defaults; an empty value counts as unset, as in `load_settings`."""
    given = {name: value for name, value in env.items() if value.strip()}
    if "SPRITE_ISOLATION" not in given:
        given["SPRITE_ISOLATION"] = dev_isolation()
    return {**DEV_DEFAULTS, **given}


def dev_isolation() -> str:
    """Dev mode's own choice: the CLI's sandbox where it can run, else none; never `user` unasked."""
    from sprite_os.isolation.probe import sandbox_problem

    return "sandbox" if sandbox_problem() is None else "none"


def isolation_line(app: SpriteOS, asked: str | None) -> str:
    """The banner's word on isolation: the mode, why, and what it did to the workspace."""
    iso, ws = app.launch.isolation, app.settings.workspace
    if iso.mode == "user" and iso.agent_user is not None:
        return (f"user ({iso.reason}): {ws} is now root:{iso.agent_user.name}, mode 1770, and its folders "
                f"the agent's, so the kernel keeps it out of .os/")
    if iso.mode == "sandbox":
        why = iso.reason if asked else "dev mode's choice, which changes no owner in the workspace"
        return f"sandbox ({why}): the CLI's bubblewrap sandbox; SPRITE_ISOLATION=user (as root) runs it as its own user"
    from sprite_os.isolation.probe import sandbox_problem

    why = iso.reason if asked else f"the CLI's sandbox cannot run: {sandbox_problem()}"
    return f"none -- NOT ISOLATED ({why}): the agent's commands can change .os/"


def require_dev_extra() -> None:
    try:
        import aiohttp  # noqa: F401  (the mock Bridge's server)
    except ImportError:
        raise DevExtraMissing(f"dev mode's mock model needs the dev extra: {INSTALL_HINT}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m devkit.dev_mode`."""
    parser = argparse.ArgumentParser(prog="python -m devkit.dev_mode", description="Sprite OS on a local workspace "
                                     "(default ./.workspace) with the demo model, as `make run` starts it.")
    parser.add_argument("--workspace", help="env SPRITE_WORKSPACE, default ./.workspace")
    parser.add_argument("--host", help="address to listen on (env SPRITE_OS_HOST)")
    parser.add_argument("--port", type=int, help="port to listen on (env SPRITE_OS_PORT, default 8765)")
    args = parser.parse_args(argv)
    return guarded(lambda: dev_main(settings_from(args, dev_environment(os.environ))))


def dev_main(settings: Settings) -> int:
    settings = settings.with_overrides(workspace=settings.workspace.resolve())
    if not settings.anthropic_base_url:
        require_dev_extra()
    configure_logging(settings.log_format, settings.log_level, settings.log_file)
    settings.layout.ensure()
    install_templates(settings.layout, TEMPLATES, "dev")
    token = resolve_token(settings, create=True)
    return asyncio.run(_serve(settings, token))


async def _serve(settings: Settings, token: str) -> int:
    from sprite_os.server import SpriteOS, run_until_signalled

    bridge = None
    if not settings.anthropic_base_url:
        from .mock_bridge import MockBridge
        from .mock_bridge.demo import DEV_WORD_DELAY

        bridge = MockBridge(demo_curator=True, demo_word_delay=DEV_WORD_DELAY)
        await bridge.start()
        settings = settings.with_overrides(anthropic_base_url=bridge.url)
    app = SpriteOS(settings, token)
    ready = asyncio.Event()

    async def announce() -> None:
        await ready.wait()
        asked = os.environ.get("SPRITE_ISOLATION", "").strip() or None
        print(banner(settings, app.port, token, bridge.url if bridge else None, isolation_line(app, asked)), flush=True)

    announcing = asyncio.create_task(announce())
    try:
        await run_until_signalled(app, ready)
    finally:
        announcing.cancel()
        if bridge is not None:
            await bridge.stop()
    return 0


def banner(settings: Settings, port: int, token: str, mock_url: str | None, isolation: str = "") -> str:
    """What `make run` prints once the server listens: where, the token, and how to talk to it."""
    url = f"ws://{settings.host}:{port}"
    script = Path(sys.executable).with_name("sprite-os")
    command = shlex.quote(str(script)) if script.exists() else f"{shlex.quote(sys.executable)} -m sprite_os"
    model = (f"the demo model and demo curator (embedded mock Bridge at {mock_url})" if mock_url
             else f"the proxy at {settings.anthropic_base_url}")
    return f"""
Sprite OS (dev mode) is serving on {url}
  console    http://{settings.host}:{port}/   (open it in a browser and type the token)
  workspace  {settings.workspace}
  token      {token}
  model      {model}
  memory     curated every {settings.memory_batch_turns} turns and when a session ends
  isolation  {isolation or settings.isolation}
  health     curl http://{settings.host}:{port}/healthz
  talk       SPRITE_WORKSPACE={shlex.quote(str(settings.workspace))} {command} chat --url {url}

Try: "My name is Dana and I live in Lisbon", then /new (a fresh session), then
"What is my name?" and "search: Dana". "card: Groceries" makes a canvas card.
Ctrl-C stops the server.
"""


if __name__ == "__main__":
    raise SystemExit(main())
