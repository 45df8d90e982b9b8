"""The service's settings: what a `sprite-os service start` hands the server it spawns.

A start takes each setting from its own environment when set there, and otherwise from the
ones remembered (`.os/state/service.env`, 0600) by the last start that got /healthz to answer.
A setting set to the empty string counts as unset. SPRITE_OS_TOKEN is never remembered: the
token file is its one source, which a deploy's --token-file rotates.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from .. import PACKAGE_DIR, RELEASE_DIR
from ..config import ENV_VARS, Settings, load_settings, store_token
from ..errors import ConfigError
from ..fsutil import atomic_write

NOT_REMEMBERED = ("SPRITE_OS_TOKEN",)  # the token file is the one source (see adopt_token)


class ServiceEnv:
    def __init__(self, settings: Settings, log_file: Path) -> None:
        self.settings = settings
        self.env_file = settings.layout.service_env
        self.log_file = log_file

    def child_env(self, base: Mapping[str, str] | None = None, *, remembered: bool = True) -> dict[str, str]:
        """The server's environment: ours, the remembered settings where ours has none, and
        the deployed defaults (JSON logs to .os/logs/sprite-os.log)."""
        env = dict(os.environ if base is None else base)
        for name, value in (self.remembered() if remembered else {}).items():
            if name not in env:
                env[name] = value
        env["SPRITE_WORKSPACE"] = str(self.settings.workspace)
        if not env.get("SPRITE_LOG_FORMAT"):
            env["SPRITE_LOG_FORMAT"] = "json"
        if not env.get("SPRITE_LOG_FILE"):
            env["SPRITE_LOG_FILE"] = str(self.log_file)
        env.pop("PYTHONHOME", None)
        # Pin the release: on a Sprite the package is imported through .os/lib -> current, which
        # a deploy switches under a running server. releases/<V>/lib names this release only.
        release_lib = RELEASE_DIR / "lib"
        if (release_lib / "sprite_os").resolve() == PACKAGE_DIR:
            env["PYTHONPATH"] = str(release_lib)
        return env

    def child_settings(self, env: Mapping[str, str] | None = None) -> Settings:
        """The settings the server will see; a bad one (including a remembered one, which the
        message then names) raises ConfigError, a one-line exit 2."""
        try:
            child = load_settings(self.child_env() if env is None else env)
            if child.port == 0:
                raise ConfigError("SPRITE_OS_PORT=0 (any free port) cannot be used by the service, "
                                  "which must know its port: set it from 1 to 65535")
        except ConfigError as exc:
            note = self.remembered_note(named_in=str(exc))
            raise ConfigError(f"{exc} ({note})" if note else str(exc)) from None
        return child

    def remembered(self) -> dict[str, str]:
        try:
            data = json.loads(self.env_file.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if k in ENV_VARS and k not in NOT_REMEMBERED and isinstance(v, str)}

    def remember(self, env: Mapping[str, str]) -> None:
        keep = {k: env[k] for k in ENV_VARS if env.get(k) and k not in NOT_REMEMBERED}
        self._save(keep)

    def remembered_note(self, named_in: str | None = None) -> str:
        """Which remembered settings this start uses (only those `named_in` names, if given):
        those its own environment does not set, and which change what it would have without them."""
        env, without = self.child_env(), self.child_env(remembered=False)
        used = sorted(name for name in self.remembered() if env.get(name) != without.get(name))
        names = [n for n in used if named_in is None or n in named_in]
        if not names:
            return ""
        it = "it" if len(names) == 1 else "them"
        return (f"using remembered {', '.join(names)} from {self.env_file}; "
                f"set {it} to the empty string to drop {it}")

    def adopt_token(self, env: dict[str, str]) -> bool:
        """SPRITE_OS_TOKEN goes into the token file (0600) and not to the server, which reads the
        file: a deploy's --token-file rotates that file, so nothing may shadow it. A token an older
        version remembered in service.env is carried into the file if there is none yet.
        True if the token file was written."""
        token = env.pop("SPRITE_OS_TOKEN", "").strip()
        legacy = ""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            legacy = json.loads(self.env_file.read_text()).get("SPRITE_OS_TOKEN", "").strip()
        if not token and legacy and not self.settings.layout.token_file.exists():
            token = legacy
        if legacy:  # the file is the one place for it: drop it from service.env, change nothing else
            self._save(self.remembered())
        return bool(token) and store_token(self.settings, token)

    def _save(self, settings: Mapping[str, str]) -> None:
        atomic_write(self.env_file, json.dumps(settings, indent=1, sort_keys=True).encode(), mode=0o600)
