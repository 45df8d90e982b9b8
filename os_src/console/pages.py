"""Serving the console: its static files on plain HTTP GETs, with headers that keep it safe.

The page is served without the token: it holds no data. It asks for the token, checks it
with `GET /console/auth` (the token in an Authorization header, never in the URL), and
everything it shows comes over the authenticated WebSocket. websockets' HTTP parser takes
GET requests only, which is all the page needs.

Every response carries a Content-Security-Policy that allows scripts, styles and images
from this origin only (no inline script, so injected markup cannot run), sockets to this
host only, and no framing; and `nosniff`, so a file is never read as another type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .origin import origin_allowed, valid_host

STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGE_PATHS = ("/", "/console", "/console/")
ASSET_PREFIX = "/console/"
AUTH_PATH = "/console/auth"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets(root: Path = STATIC_DIR) -> dict[str, Asset]:
    """Every file under `root` by its path relative to it, read once: no disk I/O per request."""
    assets = {}
    for path in sorted(root.rglob("*")):
        kind = CONTENT_TYPES.get(path.suffix)
        if path.is_file() and kind is not None:
            body = path.read_bytes()
            assets[path.relative_to(root).as_posix()] = Asset(body, kind, f'"{hashlib.sha256(body).hexdigest()[:20]}"')
    return assets


def content_security_policy(host: str | None) -> str:
    sockets = f" ws://{host} wss://{host}" if host and valid_host(host) else ""
    return ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
            f"connect-src 'self'{sockets}; object-src 'none'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


def is_upgrade(request: Request) -> bool:
    return any("websocket" in value.lower() for value in request.headers.get_all("Upgrade"))


class ConsolePages:
    """Answers the plain GETs: the page, its assets, and the token check."""

    def __init__(self, authorized: Callable[[Request], bool], allowed_origins: tuple[str, ...] = (),
                 root: Path = STATIC_DIR) -> None:
        self._authorized = authorized
        self._allowed = allowed_origins
        self._assets = load_assets(root)

    def respond(self, conn: ServerConnection, request: Request) -> Response | None:
        """A response for a plain GET, or None for a WebSocket upgrade (the caller's to judge)."""
        if is_upgrade(request):
            return None
        path = request.path.split("?", 1)[0]
        if path == AUTH_PATH:
            return http_response(conn, self._check(request), b"", "text/plain; charset=utf-8", request)
        name = "index.html" if path in PAGE_PATHS else path[len(ASSET_PREFIX):] if path.startswith(ASSET_PREFIX) else None
        asset = self._assets.get(name) if name is not None else None
        if asset is None:
            return http_response(conn, HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8", request)
        if asset.etag in request.headers.get("If-None-Match", ""):
            return http_response(conn, HTTPStatus.NOT_MODIFIED, b"", asset.content_type, request, asset.etag)
        return http_response(conn, HTTPStatus.OK, asset.body, asset.content_type, request, asset.etag)


    def _check(self, request: Request) -> HTTPStatus:
        """What the page's WebSocket would get, which a browser cannot read from a refused handshake:
        401 for a wrong token, 403 when the page's origin (sent as X-Sprite-Origin: a same-origin
        GET carries no Origin) may not connect (a proxy that rewrites Host, say), else 204."""
        if not self._authorized(request):
            return HTTPStatus.UNAUTHORIZED
        if not origin_allowed(request.headers.get("X-Sprite-Origin"), request.headers.get("Host"), self._allowed):
            return HTTPStatus.FORBIDDEN
        return HTTPStatus.NO_CONTENT


def http_response(conn: ServerConnection, status: HTTPStatus, body: bytes, content_type: str,
                  request: Request | None = None, etag: str | None = None) -> Response:
    """A response with `body`, keeping websockets' own headers (Date, Server, Connection)."""
    base = conn.respond(status, "")
    out = Headers((k, v) for k, v in base.headers.raw_items() if k.lower() not in ("content-type", "content-length"))
    # Headers is a multi-dict: each header is set once, never overwritten.
    out["Content-Type"] = content_type
    out["Content-Length"] = str(len(body))
    if request is not None:
        out["Content-Security-Policy"] = content_security_policy(request.headers.get("Host"))
        out["X-Content-Type-Options"] = "nosniff"
        out["X-Frame-Options"] = "DENY"
        out["Referrer-Policy"] = "no-referrer"
        out["Cache-Control"] = "no-cache"
    if etag is not None:
        out["ETag"] = etag
    return Response(base.status_code, base.reason_phrase, out, body)
