"""Which web pages may open the WebSocket: the page's own origin, or an allow-listed one.

A browser sends `Origin` with every WebSocket handshake, and a page on another site can
open a socket to any host it likes; the token in its subprotocols would be the only
barrier. Checking Origin keeps another site open in the same browser from driving the
Sprite. Clients that are not browsers send no Origin and are judged by the token alone.
Pure functions, no I/O. How an origin is written (normalize_origin) is config.py's, which reads the
allow-list from SPRITE_OS_ALLOWED_ORIGINS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..config import DEFAULT_PORTS, normalize_origin

_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$")


def valid_host(host: str) -> bool:
    """A Host header that is only a name or address and a port (safe to repeat in a header)."""
    return bool(_HOST.match(host))


def same_host(origin: str, host: str) -> bool:
    """Whether a normalized `origin` names the host:port the request was sent to (its Host
    header, whose port defaults to the origin scheme's). The scheme is not compared: behind a
    TLS terminator the page is https while the server sees plain HTTP."""
    if not valid_host(host):
        return False
    scheme, _, rest = origin.partition("://")
    if ":" not in host.rsplit("]", 1)[-1]:
        host = f"{host}:{DEFAULT_PORTS[scheme]}"
    return rest == host.lower()


def origin_allowed(origin: str | None, host: str | None, allowed: Iterable[str]) -> bool:
    """The Origin check for a WebSocket upgrade: no Origin (not a browser) is allowed; a
    browser's must be the page's own host:port or one of `allowed` (normalized origins)."""
    if origin is None:
        return True
    normal = normalize_origin(origin)
    if normal is None:
        return False
    return (host is not None and same_host(normal, host)) or normal in allowed
