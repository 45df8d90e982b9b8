"""`make run`: Sprite OS on a local workspace, with the mock Bridge embedded unless
ANTHROPIC_BASE_URL points at a real proxy.

    python -m sprite_os.dev.serve [--workspace ./.workspace] [--port 8765]

The workspace is shaped like /workspace (`.os/` inside); its token is created
on first run and printed, with how to talk to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from sprite_os.config import load_settings, resolve_token
from sprite_os.dev.mock_bridge import MockBridge
from sprite_os.errors import ConfigError
from sprite_os.logs import configure_logging
from sprite_os.server import SpriteOS, run_until_signalled

BOOTSTRAP_TEMPLATES = Path(__file__).resolve().parent.parent / "bootstrap" / "templates"


def seed_memory_files(memory_dir: Path) -> None:
    """What a deploy would do: the deploy-managed files, and the curated ones if missing."""
    memory_dir.mkdir(parents=True, exist_ok=True)
    if not BOOTSTRAP_TEMPLATES.is_dir():
        return
    for template in BOOTSTRAP_TEMPLATES.glob("*.md"):
        target = memory_dir / template.name
        if template.name in ("soul.md", "os.md") or not target.exists():
            shutil.copyfile(template, target)


async def main(workspace: Path, port: int | None) -> int:
    settings = load_settings().with_overrides(workspace=workspace, port=port)
    configure_logging(settings.log_format, settings.log_level, settings.log_file)
    settings.layout.ensure()
    seed_memory_files(settings.layout.memory_dir)
    token = resolve_token(settings, create=True)
    bridge: MockBridge | None = None
    if not settings.anthropic_base_url:
        bridge = MockBridge()
        await bridge.start()
        settings = settings.with_overrides(anthropic_base_url=bridge.url)
    ready = asyncio.Event()
    app = SpriteOS(settings, token)
    serving = asyncio.create_task(run_until_signalled(app, ready))
    await asyncio.wait({serving, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if ready.is_set():
        model = f"the embedded mock Bridge at {bridge.url}" if bridge else settings.anthropic_base_url
        print(f"""
Sprite OS is serving on ws://{settings.host}:{app.port}   (model proxy: {model})
  console    http://{settings.host}:{app.port}/   (open it in a browser and type the token)
  workspace  {settings.workspace}
  token      {token}
  health     curl http://{settings.host}:{app.port}/healthz
  talk       SPRITE_WORKSPACE={settings.workspace} {sys.executable} -m sprite_os chat --url ws://{settings.host}:{app.port}
With the mock Bridge, try "card: Groceries" or "search: tea". Ctrl-C stops the server.
""", flush=True)
    try:
        await serving
    finally:
        if bridge is not None:
            await bridge.stop()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path(os.environ.get("SPRITE_WORKSPACE", ".workspace")))
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    try:
        raise SystemExit(asyncio.run(main(args.workspace.resolve(), args.port)))
    except ConfigError as exc:
        print(f"sprite-os: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
