"""`python -m tests.redteam_server`: `sprite-os serve`, but without the memory daemon.

The red team (test_isolation_redteam_e2e.py) runs the server as its own process, as a Sprite does,
so that its environment and memory hold the token as a deployed server's do. Without the daemon
nothing but an attacker writes the databases: any change to them is the attack's.
"""

from __future__ import annotations

import asyncio

from sprite_os.config import load_settings, resolve_token
from sprite_os.logs import configure_logging
from sprite_os.server import SpriteOS, run_until_signalled


def main() -> int:
    settings = load_settings()
    configure_logging(settings.log_format, settings.log_level, settings.log_file)
    token = resolve_token(settings, create=False)
    asyncio.run(run_until_signalled(SpriteOS(settings, token, memory=False)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
