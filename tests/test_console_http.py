"""The console's serving without a browser: the page and its headers, the token check, the
Origin rule for upgrades, and memory requests through the real server's WebSocket."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import pytest_asyncio
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from sprite_os.config import Settings, load_settings
from sprite_os.console.origin import normalize_origin, origin_allowed
from sprite_os.console.pages import STATIC_DIR, content_security_policy
from sprite_os.errors import ConfigError
from sprite_os.memory.files import MemoryFiles
from sprite_os.server import SpriteOS
from tests.conftest import TOKEN, client_factory, make_settings, running

# The tests that only ask the server things share one (55 starts were ten seconds of this module);
# a test that changes what it serves starts its own (`own_app`).
shared = pytest.mark.asyncio(loop_scope="module")


def _app(workspace: Path) -> AbstractAsyncContextManager[SpriteOS]:
    return running(make_settings(workspace, "http://127.0.0.1:9", allowed_origins=("https://console.example:8443",)))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SpriteOS]:
    async with _app(tmp_path_factory.mktemp("console-http") / "workspace") as server:
        yield server


@pytest.fixture
async def own_app(tmp_path: Path) -> AsyncIterator[SpriteOS]:
    async with _app(tmp_path / "workspace") as server:
        yield server


def _get(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP GET, off the event loop the server runs on."""
    return await asyncio.to_thread(_get, port, path, headers)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "BREW"])
@pytest.mark.parametrize("path", ["/", "/console/js/app.js", "/console/auth", "/healthz", "/nope"])
@shared
async def test_the_http_endpoints_answer_get_only(app: SpriteOS, method: str, path: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(4096), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 405 "), answer[:100]
    assert b"\r\nAllow: GET\r\n" in answer
    status, _, _ = await get(app.port, path)  # and GET still works
    assert status in (200, 401, 404)


@shared
async def test_the_page_is_served_with_a_strict_policy_and_no_token(app: SpriteOS) -> None:
    for path in ("/", "/console", "/console/"):
        status, headers, body = await get(app.port, path)
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert b'<script type="module" src="/console/js/app.js"></script>' in body
        assert TOKEN.encode() not in body
    csp = headers["Content-Security-Policy"]
    for directive in ("default-src 'self'", "script-src 'self'", f"connect-src 'self' ws://127.0.0.1:{app.port} "
                      f"wss://127.0.0.1:{app.port}", "frame-ancestors 'none'", "object-src 'none'"):
        assert directive in csp
    assert "unsafe" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "no-referrer"
    html = (STATIC_DIR / "index.html").read_text()
    # Nothing inline for the policy to forbid: one external module, no handlers, no style attributes.
    assert re.findall(r"<script\b[^>]*>", html) == ['<script type="module" src="/console/js/app.js">']
    assert not re.search(r"\son[a-z]+\s*=|\sstyle\s*=", html)
    scripts = "".join(p.read_text() for p in (STATIC_DIR / "js").glob("*.js"))
    assert not re.search(r"\.(innerHTML|outerHTML|insertAdjacentHTML)\b", scripts)
    assert "eval(" not in scripts and "document.write" not in scripts


@shared
async def test_every_asset_is_served_with_its_type_and_a_validator(app: SpriteOS) -> None:
    assets = sorted(p.relative_to(STATIC_DIR).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file())
    assert {"index.html", "console.css", "favicon.svg", "js/app.js", "js/connection.js", "js/markdown.js"} <= set(assets)
    types = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
             ".html": "text/html; charset=utf-8"}
    for name in assets:
        status, headers, body = await get(app.port, f"/console/{name}")
        assert status == 200 and headers["Content-Type"] == types[Path(name).suffix], name
        assert body == (STATIC_DIR / name).read_bytes()
    status, headers, _ = await get(app.port, "/console/js/app.js")
    again, _, body = await get(app.port, "/console/js/app.js", **{"If-None-Match": headers["ETag"]})
    assert (again, body) == (304, b"")
    for missing in ("/console/../token", "/console/js/nope.js", "/favicon.ico", "/console/static/index.html"):
        assert (await get(app.port, missing))[0] == 404, missing


@shared
async def test_the_token_check_answers_204_401_or_403_for_the_pages_origin(app: SpriteOS) -> None:
    assert (await get(app.port, "/console/auth", Authorization=f"Bearer {TOKEN}"))[0] == 204
    assert (await get(app.port, "/console/auth", Authorization="Bearer wrong-token-0123456789"))[0] == 401
    assert (await get(app.port, "/console/auth"))[0] == 401
    assert (await get(app.port, "/console/auth?token=" + TOKEN))[0] == 401  # never from the URL
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    own = f"http://127.0.0.1:{app.port}"
    for origin, status in ((own, 204), ("https://console.example:8443", 204), ("http://evil.example", 403)):
        assert (await get(app.port, "/console/auth", **bearer, **{"X-Sprite-Origin": origin}))[0] == status


@pytest.mark.parametrize(("origin", "allowed"), [
    (None, True),  # not a browser: the token alone decides
    ("http://127.0.0.1:{port}", True),  # the console's own page
    ("https://127.0.0.1:{port}", True),  # the same host and port behind a TLS terminator
    ("https://console.example:8443", True),  # allow-listed
    ("http://evil.example", False),
    ("http://127.0.0.1:1", False),  # another port is another origin
    ("http://localhost:{port}", False),  # another name for the same host is another origin
    ("null", False),  # a sandboxed frame or a file:// page
])
@shared
async def test_an_upgrade_from_another_origin_is_refused_with_403(app: SpriteOS, origin: str | None,
                                                                  allowed: bool) -> None:
    origin = origin.format(port=app.port) if origin else None
    url = f"ws://127.0.0.1:{app.port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if allowed:
        async with connect(url, additional_headers=headers, origin=origin) as ws:  # type: ignore[arg-type]
            await ws.send(json.dumps({"type": "ping", "nonce": "n"}))
            assert json.loads(await ws.recv())["type"] == "ready"
        return
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, additional_headers=headers, origin=origin):  # type: ignore[arg-type]
            pass
    assert info.value.response.status_code == 403


def test_origins_are_normalized_and_the_host_must_match() -> None:
    assert normalize_origin("HTTP://Example.COM") == "http://example.com:80"
    assert normalize_origin("https://[::1]:8443/") == "https://[::1]:8443"
    for bad in ("null", "ftp://x", "https://x/path", "https://u:p@x", "https://x?q", "x", "https://x:99999"):
        assert normalize_origin(bad) is None, bad
    assert origin_allowed("http://sprite.local", "sprite.local:80", ())
    assert origin_allowed("https://sprite.local", "sprite.local", ())
    assert not origin_allowed("http://sprite.local", "sprite.local:8765", ())
    assert not origin_allowed("http://sprite.local:8765", "sprite.local:8765\r\nX: y", ())
    assert not origin_allowed("http://a.example", None, ())


def test_allowed_origins_setting_is_validated() -> None:
    s = load_settings({"SPRITE_OS_ALLOWED_ORIGINS": " https://a.example , http://B.example:8080,, https://a.example "})
    assert s.allowed_origins == ("https://a.example:443", "http://b.example:8080")
    with pytest.raises(ConfigError, match="SPRITE_OS_ALLOWED_ORIGINS must be comma-separated origins"):
        load_settings({"SPRITE_OS_ALLOWED_ORIGINS": "https://a.example/console"})
    assert "'host'" not in content_security_policy("evil.example\r\nX-Injected: 1")
    assert "ws://" not in content_security_policy("evil.example; script-src *")


async def test_memory_requests_are_answered_to_their_connection_only(own_app: SpriteOS) -> None:
    app = own_app
    MemoryFiles(app.settings.layout).write("user.md", "# User\n- Name: Ada\n", source="seed")
    async with client_factory(app.port) as open_client:
        asking, watching = await open_client(hello={}), await open_client(hello={})
        await asking.send(type="memory_file", request_id="q1", name="user.md")
        answer = await asking.until("memory_file_result")
        assert answer["request_id"] == "q1" and answer["text"] == "# User\n- Name: Ada\n"
        assert answer["seq"] == asking.last_seq  # like pong: the last seq this connection was sent
        await asking.send(type="memory_rollback", request_id="q2", name="user.md", number=5)
        error = await asking.until("error")
        assert (error["code"], error["request_id"]) == ("not_found", "q2")
        await asking.send(type="memory_search", request_id="q3", limit=500)
        error = await asking.until("error", lambda f: f["request_id"] == "q3")
        assert error["code"] == "invalid_frame" and "limit" in error["message"]
        await asking.send(type="memory_boot_prompt", request_id="q4")
        prompt = await asking.until("memory_boot_prompt_result")
        assert "- Name: Ada" in prompt["text"] and prompt["tokens_estimate"] > 0
        await watching.send(type="ping", nonce="after")
        await watching.until("pong")
        assert [f["type"] for f in watching.frames] == ["ready", "pong"]  # nothing of the other's requests


async def test_without_memory_a_request_is_memory_unavailable(settings: Settings) -> None:
    async with running(settings, memory=False) as app, client_factory(app.port) as open_client:
        c = await open_client(hello={})
        await c.send(type="memory_files", request_id="m")
        error = await c.until("error")
        assert (error["code"], error["request_id"]) == ("memory_unavailable", "m")
