"""Cards the person controls and files in and out, in a real Chromium: a 3,000-character word
wraps inside its card (desktop and phone), a card opens large, copies and closes (on every
device); files are browsed and downloaded (in chunks over the socket, byte for byte), uploads
(picked or dropped) land in documents/, a chunk the server drops for rate is sent again while the
person sees it retrying, an upload whose answer is lost with the connection goes on once the page
reconnects without a chunk written twice, and the agent's next turn, through the real CLI, is told;
a path out of user space is refused over the socket. Real server, real CLI, the mock Bridge."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from playwright.async_api import Locator, expect

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os import gateway
from sprite_os.console import files_frames
from sprite_os.server import SpriteOS
from sprite_os.tools.canvas import CreateCard
from tests.conftest import TOKEN, wait_for
from tests.console_browser import (
    PHONE,
    HeldFrames,
    Tab,
    chromium,
    intercepted,
    open_tab,
    refused,
    screenshot,
    screenshot_dir,
    signed_in,
)

pytestmark = pytest.mark.e2e

WORD = "Scan_2026_11_25_ACME_Corporation_Invoice_" + "0042" * 740  # 3,001 characters, no break
URL = "https://files.example/" + "a" * 600


async def fits(tab: Tab, card_id: str) -> None:
    """The card is no wider than its column, nothing in it overflows, and its badge is inside it."""
    box = await tab.page.evaluate("""(id) => {
        const card = document.querySelector(`[data-card-id="${id}"]`);
        const column = card.parentElement.getBoundingClientRect();
        const c = card.getBoundingClientRect(), b = card.querySelector(".badge").getBoundingClientRect();
        return {card: c.width, column: column.width, over: card.scrollWidth - card.clientWidth,
                badgeInside: b.left >= c.left && b.right <= c.right + 0.5 && b.width > 0};
    }""", card_id)
    assert box["card"] <= box["column"] + 0.5 and box["over"] <= 0 and box["badgeInside"], box


async def test_a_long_word_wraps_and_a_card_opens_copies_and_closes_everywhere(
        server: SpriteOS, bridge: MockBridge, tmp_path: Path) -> None:
    shots = screenshot_dir(tmp_path)
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {
        "id": "scan", "title": f"File {WORD[:180]}", "kind": "document", "body": f"Saved as {WORD}\n\nSee {URL}"}),
        Text("The scan is on the canvas.")))
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        await tab.sign_in()
        await tab.connected()
        await tab.send("Put the scan on a card")
        card = tab.page.locator('[data-card-id="scan"]')
        await expect(card).to_contain_text(WORD)
        await fits(tab, "scan")
        phone = await open_tab(browser, tab.base, viewport=PHONE)
        await phone.sign_in()
        await phone.connected()
        await phone.by("canvas-tab").click()
        await expect(phone.by("card")).to_have_count(1)
        await fits(phone, "scan")
        await screenshot(phone, shots, "phone-canvas-long-word-light")

        await card.get_by_test_id("card-copy").click()
        await expect(card.get_by_test_id("card-copy")).to_have_attribute("data-copied", "true")
        copied = await tab.page.evaluate("navigator.clipboard.readText()")
        assert copied.startswith(f"File {WORD[:180]}\n\nSaved as {WORD}")

        await card.get_by_test_id("card-expand").click()
        dialog = tab.by("card-dialog")
        await expect(dialog).to_be_visible()
        await expect(dialog).to_contain_text(URL)
        await screenshot(tab, shots, "canvas-card-open-light")
        await tab.page.keyboard.press("Escape")
        await expect(dialog).to_be_hidden()

        await card.get_by_test_id("card-close").focus()  # the keyboard alone closes it
        await tab.page.keyboard.press("Enter")
        await expect(tab.by("card")).to_have_count(0)
        await expect(phone.by("card")).to_have_count(0)  # on every device
        await expect(tab.by("card-count")).to_have_text("")
        tab.assert_clean()
        phone.assert_clean()


async def test_files_browse_download_upload_and_the_agent_is_told(
        server: SpriteOS, bridge: MockBridge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shots = screenshot_dir(tmp_path)
    root = server.settings.layout.root
    (root / "documents" / "lease.txt").write_text("The lease ends on 2027-03-31.\n")
    (root / "artifacts" / "summary.md").write_text("# Summary\n")
    (root / "report\u202efdp.exe").write_text("spoof")  # reads as "reportexe.pdf" if shown as it is
    with open(os.fsencode(root) + b"/bad\xff", "wb"):  # not UTF-8: listed escaped, never failing the list
        pass
    pdf = bytes(range(256)) * 5000  # 1.2 MB: three chunks
    scan = os.urandom(1_300_000)  # three chunks of a download
    (root / "documents" / "scan.bin").write_bytes(scan)
    picked = tmp_path / "invoice march.pdf"
    picked.write_bytes(pdf)
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.by("files-tab").click()
        entries = tab.by("file-entry")
        await expect(entries.first).to_have_attribute("data-name", "artifacts")
        assert ".os" not in [await e.get_attribute("data-name") for e in await entries.all()]
        await expect(tab.page.locator('[data-name="report\u202efdp.exe"]')).to_contain_text("report[U+202E]fdp.exe")
        bad = tab.page.locator('[data-name="bad\ufffd"]')
        await expect(bad).to_contain_text("its name is not UTF-8: rename it")
        await expect(bad.get_by_test_id("download")).to_have_count(0)
        await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
        await expect(tab.by("files-view")).to_have_attribute("data-path", "documents")
        async with tab.page.expect_download() as waiting:
            await tab.page.locator('[data-name="lease.txt"]').get_by_test_id("download").click()
        download = await waiting.value
        assert download.suggested_filename == "lease.txt"
        assert Path(await download.path()).read_text() == "The lease ends on 2027-03-31.\n"
        await tab.page.evaluate("""() => {  // the type of every Blob the page saves
            const make = URL.createObjectURL;
            window.blobTypes = [];
            URL.createObjectURL = (blob) => { window.blobTypes.push(blob.type); return make.call(URL, blob); };
        }""")
        async with tab.page.expect_download() as waiting:
            await tab.page.locator('[data-name="scan.bin"]').get_by_test_id("download").click()
        download = await waiting.value
        assert hashlib.sha256(Path(await download.path()).read_bytes()).digest() == hashlib.sha256(scan).digest()
        await expect(tab.by("download-progress").first).to_have_attribute("data-state", "done")
        assert await tab.page.evaluate("window.blobTypes") == ["application/octet-stream"]
        assert server.files.downloads.under_way == 0  # finished at its last chunk
        # A chunk that timed out is not asked again: its answer may still come, behind the others.
        asked = await tab.page.evaluate("""async () => {
            const { retried } = await import("/console/js/files.js");
            let calls = 0;
            const fail = (code) => () => { calls += 1; return Promise.reject(Object.assign(new Error(code), { code })); };
            const codes = [];
            for (const code of ["timeout", "busy"]) {
                calls = 0;
                await retried(fail(code), () => { if (calls > 1) throw Object.assign(new Error("enough"), { code: "x" }); })
                    .catch(() => {});
                codes.push([code, calls]);
            }
            return codes;
        }""")
        assert asked == [["timeout", 1], ["busy", 2]], asked  # busy: dropped unhandled, so asked again

        # The server drops the first chunk of the next upload for rate, as if the person sent too fast.
        dropped: list[str] = []

        async def drop_one_chunk(conn: gateway._Connection, message: str) -> bool:
            if dropped or '"upload_chunk"' not in message:
                return False
            dropped.append(message)
            await conn._rate_limited(0.0, message)
            return True

        intercepted(monkeypatch, drop_one_chunk)
        await tab.page.evaluate("""() => {  // every state an upload line goes through, however brief
            window.transferStates = [];
            new MutationObserver((changes) => { for (const c of changes) {
                const line = c.target.closest?.('[data-testid="upload"]');
                if (line) window.transferStates.push(`${line.dataset.state}: ${line.querySelector(".state")?.textContent}`);
            } }).observe(document.querySelector('[data-testid="uploads"]'),
                         {subtree: true, childList: true, characterData: true, attributes: true});
        }""")

        await tab.by("upload-input").set_input_files(str(picked))  # picked
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done")
        await tab.page.evaluate("""() => {  // dropped
            const data = new DataTransfer();
            data.items.add(new File(["notes from the meeting"], "meeting notes.txt", {type: "text/plain"}));
            const zone = document.querySelector('[data-testid="drop-zone"]');
            zone.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
        }""")
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done")
        assert (root / "documents" / "invoice march.pdf").read_bytes() == pdf  # the dropped chunk, sent again
        assert len(dropped) == 1 and '"offset":0' in dropped[0].replace(" ", "")
        states = await tab.page.evaluate("window.transferStates")
        assert any(s.startswith("retrying: retrying (1)") for s in states), states
        assert states.index(next(s for s in states if s.startswith("retrying"))) < states.index(
            next(s for s in states if s.startswith("done")))
        assert (root / "documents" / "meeting notes.txt").read_text() == "notes from the meeting"
        await expect(tab.page.locator('[data-name="meeting notes.txt"]')).to_have_count(1)  # the list is current
        await screenshot(tab, shots, "files-light")

        monkeypatch.setattr(files_frames, "MAX_TRANSFER_BYTES", 1000)
        await tab.by("upload-input").set_input_files(str(picked))
        await expect(tab.by("upload").first).to_have_attribute("data-state", "error")
        await expect(tab.by("files-flash")).to_contain_text("over the upload limit")
        assert sorted(p.name for p in (root / "documents").iterdir()) == [
            "invoice march.pdf", "lease.txt", "meeting notes.txt", "scan.bin"]

        refused = await tab.page.evaluate("""async (token) => {
            const socket = new WebSocket(`ws://${location.host}/`, ["sprite-os.v1", `bearer.${token}`]);
            const answers = await new Promise((resolve) => {
                const got = [];
                socket.onopen = () => {
                    socket.send(JSON.stringify({type: "file_read", request_id: "a", path: ".os/token"}));
                    socket.send(JSON.stringify({type: "upload_start", request_id: "b", name: "../.os/x", size: 1}));
                    socket.send(JSON.stringify({type: "download_start", request_id: "c", path: ".os/token"}));
                    socket.send(JSON.stringify({type: "download_start", request_id: "d", path: "documents/../.os/token"}));
                };
                socket.onmessage = (m) => { const f = JSON.parse(m.data); if (f.request_id) got.push(f); if (got.length === 4) resolve(got); };
            });
            socket.close();
            return answers.map((f) => [f.request_id, f.type, f.code || f.upload_id]);
        }""", TOKEN)
        assert refused[0] == ["a", "error", "bad_path"]
        assert refused[1][:2] == ["b", "upload_start_result"]  # named "x", in documents/ if sent
        assert refused[2:] == [["c", "error", "bad_path"], ["d", "error", "bad_path"]]

        await tab.by("chat-tab").click()
        await expect(tab.page.locator('[data-kind="upload"]')).to_have_count(2)
        await tab.send("What did I just upload?")
        await expect(tab.messages("assistant").last).to_contain_text("You said: What did I just upload?")
        told = json.dumps(bridge.agent_requests()[-1].messages)
        assert "The person uploaded documents/invoice march.pdf (1.2 MB) through the console." in told
        assert "documents/meeting notes.txt" in told
        tab.assert_clean()


DROP_ON = """([testid, name]) => {  // a file dropped on the element; whether the browser's default was prevented
    const data = new DataTransfer();
    data.items.add(new File(["dropped where it was not asked for"], name, {type: "text/plain"}));
    const on = document.querySelector(`[data-testid="${testid}"]`);
    on.dispatchEvent(new DragEvent("dragover", {dataTransfer: data, bubbles: true, cancelable: true}));
    return !on.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
}"""


async def test_a_file_dropped_outside_the_files_view_is_uploaded_not_opened(server: SpriteOS) -> None:
    """A file dropped on the chat (or anywhere but the Files view's zone) was the browser's to open: the
    tab left the console for the file. Signed in, it is uploaded, the Files view shown (a card open large,
    a modal dialog, closed: it would hide the upload); signed out, the drop does nothing."""
    documents = server.settings.layout.root / "documents"
    await server.canvas.create(CreateCard(title="A card open large", body="Its text", id="open-large"))
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("card-expand").click()
        await expect(tab.by("card-dialog")).to_be_visible()
        assert await tab.page.evaluate(DROP_ON, ["messages", "dropped on the chat.txt"])  # not the browser's
        await expect(tab.by("card-dialog")).to_be_hidden()
        await expect(tab.by("files-view")).to_be_visible()
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done")
        assert (documents / "dropped on the chat.txt").read_text() == "dropped where it was not asked for"
        link = """([testid]) => {  // a link dropped: opened in the tab on the page, the field's to take in a field
            const data = new DataTransfer();
            data.setData("text/uri-list", "https://elsewhere.example/");
            return !document.querySelector(`[data-testid="${testid}"]`).dispatchEvent(
                new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
        }"""
        assert await tab.page.evaluate(link, ["files-view"]) and not await tab.page.evaluate(link, ["composer"])
        assert await tab.page.evaluate(link, ["learning-forgotten"])  # a checkbox is no text field
        await tab.by("sign-out").click()
        assert await tab.page.evaluate(DROP_ON, ["token-input", "dropped signed out.txt"])
        assert not (documents / "dropped signed out.txt").exists()
        assert tab.page.url.startswith(tab.base), tab.page.url  # still the console
        tab.assert_clean()


DRAG = """([testid, kind, files]) => {  // files (or text) dragged over the element, or leaving the window from it
    const data = new DataTransfer();
    if (files) data.items.add(new File(["dragged"], "dragged.txt", {type: "text/plain"}));
    else data.setData("text/plain", "a few words");
    document.querySelector(`[data-testid="${testid}"]`).dispatchEvent(
        new DragEvent(kind, {dataTransfer: data, bubbles: true, cancelable: true, relatedTarget: null}));
}"""


async def test_files_dragged_over_the_console_say_a_drop_uploads_them(server: SpriteOS) -> None:
    """A drop anywhere on the console uploads at once: while files are dragged over it, it says so, and no
    more once they are dropped, dragged out of the window, or no longer dragged at all (Escape, which the
    page is not told of); not for text on its way to the composer, nor signed out. Over a card open large
    (a modal dialog, in the browser's top layer) too: the cue is a popover, above it."""
    await server.canvas.create(CreateCard(title="A card open large", body="Its text", id="open-large"))
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        cue = tab.by("drop-cue")
        await tab.by("card-expand").click()
        await tab.page.evaluate(DRAG, ["card-dialog", "dragover", True])
        await expect(cue).to_be_visible()
        assert await tab.page.evaluate("""() => {  // both in the top layer, the cue shown last: above the dialog
            const cue = document.querySelector('[data-testid="drop-cue"]');
            return cue.matches(":popover-open") && document.querySelector("dialog[open]") !== null;
        }""")
        await tab.page.evaluate(DRAG, ["card-dialog", "dragleave", True])
        assert await cue.is_hidden()
        await tab.page.keyboard.press("Escape")  # the card closed
        await expect(tab.by("card-dialog")).to_be_hidden()
        await tab.page.evaluate(DRAG, ["composer", "dragover", False])
        assert await cue.is_hidden()  # text: the composer's
        await tab.page.evaluate(DRAG, ["drop-zone", "dragover", False])
        assert "dropping" not in (await tab.by("drop-zone").get_attribute("class") or "")  # text is no upload
        await tab.page.evaluate(DRAG, ["messages", "dragover", True])
        await expect(cue).to_be_visible()
        await expect(cue).to_have_text("Drop to upload to documents/")
        await tab.page.evaluate(DRAG, ["messages", "dragleave", True])  # to nowhere: out of the window
        assert await cue.is_hidden()
        await tab.page.evaluate(DRAG, ["composer", "dragover", True])
        await expect(cue).to_be_visible()
        await expect(cue).to_be_hidden(timeout=3_000)  # no dragover since: the drag ended elsewhere
        assert await tab.page.evaluate(DROP_ON, ["messages", "under the cue.txt"])
        assert await cue.is_hidden()
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done")
        await tab.page.evaluate(DRAG, ["composer", "dragover", True])
        await expect(cue).to_be_visible()
        await tab.by("sign-out").click()  # mid-drag: the next dragover, over the sign-in form, takes the cue away
        await tab.page.evaluate(DRAG, ["token-input", "dragover", True])
        assert await cue.is_hidden()  # at once, not a second later
        tab.assert_clean()


async def test_a_dropped_folder_is_said_not_uploaded_and_a_failed_upload_frees_its_slot_at_once(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder in a drop came as an empty "file" of its name: stored empty, or failing to be read with
    the browser's words. It is left out, and said. An upload that fails on the page's side (a chunk
    refused for good, a file that cannot be read) held one of the Sprite's four upload slots until the
    idle sweep, two minutes: four of them held every upload back. The page cancels it."""
    refused(monkeypatch, lambda frame: '"upload_chunk"' in frame, "upload_failed", "the disk said no")  # for good
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("files-tab").click()
        split = await tab.page.evaluate("""async () => {  // a drop's items as the browser gives a folder's
            const { dropped } = await import("/console/js/files.js");
            const item = (name, isDirectory) => ({ kind: "file", getAsFile: () => new File([], name),
                                                   webkitGetAsEntry: () => ({ isDirectory }) });
            const out = dropped({ items: [item("Photos", true), item("a.txt", false)], files: [] });
            return { files: out.files.map((f) => f.name), folders: out.folders };
        }""")
        assert split == {"files": ["a.txt"], "folders": ["Photos"]}
        said = await tab.page.evaluate("""async () => {  // a view of its own: what a drop of a folder alone says
            const { FilesView } = await import("/console/js/files.js");
            const view = new FilesView(document.createElement("section"), null);
            view.uploadDropped({ files: [], folders: ["Photos"] });
            return view.flash.textContent;
        }""")
        assert said == "Folders cannot be uploaded (Photos): drop the files inside them."
        await tab.by("upload-input").set_input_files(files=[{"name": "refused.txt", "mimeType": "text/plain", "buffer": b"x" * 10}])
        await expect(tab.by("upload").first).to_have_attribute("data-state", "error")
        await wait_for(lambda: not server.files._uploads, timeout=10, what="the failed upload's slot freed")
        tab.assert_clean()


async def test_an_upload_in_place_whose_folder_fsync_failed_is_shown_uploaded_with_the_warning(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file was whole in documents/ when its folder's fsync failed: the page said "not uploaded",
    and the person's upload again made "name (2)"."""
    from devkit.faults import FsyncSpy

    spy = FsyncSpy()
    monkeypatch.setattr(os, "fsync", spy)
    spy.failing.add(server.settings.layout.root / "documents")
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("files-tab").click()
        await tab.by("upload-input").set_input_files(files=[{"name": "kept.txt", "mimeType": "text/plain", "buffer": b"kept"}])
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done")
        await expect(tab.by("files-flash")).to_contain_text(
            "kept.txt: the upload is in documents/kept.txt, but the step after failed")
        assert (server.settings.layout.root / "documents" / "kept.txt").read_bytes() == b"kept"
        tab.assert_clean()


# A drop of a folder beside a file, as the browser gives it: the folder an empty "file" whose entry is a
# directory (a DataTransfer made by a page cannot hold one, so the event carries a stand-in).
DROP_FOLDER_AND_FILE = """([testid, folder, name]) => {
    const item = (file, isDirectory) => ({ kind: "file", getAsFile: () => file, webkitGetAsEntry: () => ({ isDirectory }) });
    const event = new Event("drop", { bubbles: true, cancelable: true });
    Object.defineProperty(event, "dataTransfer", { value: { types: ["Files"], files: [],
        items: [item(new File([], folder), true), item(new File(["beside a folder"], name, { type: "text/plain" }), false)] } });
    document.querySelector(`[data-testid="${testid}"]`).dispatchEvent(event);
}"""


async def test_a_folder_dropped_with_files_is_still_said_not_uploaded_once_they_are(server: SpriteOS) -> None:
    """A folder dropped together with a file: "Folders cannot be uploaded" was said, then replaced at once
    by the file's "Uploaded …": the person never learned the folder was left out. It has a line of its own
    among the transfers, which no file's status replaces (dropped on the Files view, and on the chat)."""
    documents = server.settings.layout.root / "documents"
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        for on, folder, name in (("messages", "Photos", "beside photos.txt"), ("drop-zone", "Scans", "beside scans.txt")):
            await tab.page.evaluate(DROP_FOLDER_AND_FILE, [on, folder, name])
            await expect(tab.by("files-flash")).to_contain_text(f"Uploaded {name}")  # the file's status came last
            line = tab.by("upload").filter(has_text=f"{folder}/")
            await expect(line).to_have_attribute("data-state", "error")
            await expect(line.get_by_test_id("transfer-state")).to_have_text("not uploaded: a folder (drop the files inside it)")
            assert (documents / name).read_text() == "beside a folder"
            assert not (documents / folder).exists()
        tab.assert_clean()


async def test_an_uploads_cancel_stops_it_and_the_sprite_drops_it(server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload in progress has a Cancel on its line: the page stops sending, the line says "cancelled", and
    the Sprite is asked to drop what it has (`upload_cancel`: its slot freed at once, nothing in documents/).
    Clicked while a chunk is on its way (which then comes back refused for rate), or while the page waits
    to send one again, it does not wait out the pause first (4 s and more by the fourth retry). In a browser
    without `AbortSignal.any` (Safari before 17.4) as in any other."""
    refused(monkeypatch, lambda frame: '"upload_chunk"' in frame, "rate_limited", "slow down")  # the page retries
    chunks = HeldFrames(monkeypatch, lambda frame: '"upload_chunk"' in frame, on=False)
    documents = server.settings.layout.root / "documents"
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.page.evaluate("delete AbortSignal.any")
        await tab.by("files-tab").click()
        for name, in_flight in (("sent on its way.txt", True), ("between retries.txt", False)):
            await tab.by("upload-input").set_input_files(files=[{"name": name, "mimeType": "text/plain", "buffer": b"x" * 10}])
            line = tab.by("upload").filter(has_text=name)
            await expect(line.get_by_test_id("transfer-state")).to_have_text("retrying (3)…")
            if in_flight:
                chunks.on = True  # the fourth try, held on its way
                await wait_for(lambda: len(chunks.held) == 1, timeout=30, what="the fourth try of the chunk")
            else:
                await expect(line.get_by_test_id("transfer-state")).to_have_text("retrying (4)…")  # its pause begun
            await line.get_by_test_id("transfer-cancel").click()
            if in_flight:
                await expect(line).to_have_attribute("data-state", "cancelling")  # until the chunk's answer comes
                chunks.on = False
                await chunks.release()  # refused for rate: a pause of 3.2 s or more, were it waited out
            await expect(line.get_by_test_id("transfer-state")).to_have_text("cancelled", timeout=2_500)
            await expect(line).to_have_attribute("data-state", "cancelled")
            await expect(line.get_by_test_id("transfer-cancel")).to_have_count(0)
            await expect(tab.by("files-flash")).to_have_text(f"{name} was not uploaded: you cancelled it.")
            await wait_for(lambda: not server.files._uploads, timeout=10, what="the cancelled upload dropped")
            assert not (documents / name).exists()
        tab.assert_clean()


async def downloading(tab: Tab, name: str) -> tuple[list[object], Locator]:
    """`name` in documents/, its Download clicked in the Files view: what the browser is handed from
    now on, and the download's line."""
    saved: list[object] = []
    tab.page.on("download", lambda download: saved.append(download))
    await tab.by("files-tab").click()
    await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
    await tab.page.locator(f'[data-name="{name}"]').get_by_test_id("download").click()
    return saved, tab.by("download-progress").filter(has_text=name)


async def test_a_downloads_cancel_stops_it_and_the_sprite_lets_it_go(server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download in progress has a Cancel on its line: the page asks for no more chunks, hands nothing to
    the browser, says "cancelled", and the Sprite lets go of it (`download_cancel`: its file and its place
    freed at once, not at the idle sweep). A chunk on its way when Cancel is pressed is let go too."""
    (server.settings.layout.root / "documents" / "film.bin").write_bytes(os.urandom(3 * files_frames.CHUNK_BYTES))
    chunks = HeldFrames(monkeypatch, lambda frame: '"download_chunk"' in frame)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.page.evaluate("delete AbortSignal.any")
        saved, line = await downloading(tab, "film.bin")
        await wait_for(lambda: len(chunks.held) == 1, timeout=30, what="the first chunk asked")
        await chunks.release()
        await expect(line.get_by_test_id("transfer-state")).to_have_text("33 %")
        await wait_for(lambda: len(chunks.held) == 2, timeout=30, what="the second chunk asked")
        assert server.files.downloads.under_way == 1
        await line.get_by_test_id("transfer-cancel").press("Enter")  # by keyboard: its place stays on the line
        await expect(line).to_have_attribute("data-state", "cancelling")
        await expect(line).to_be_focused()
        await chunks.release(1)  # its answer comes: no third is asked
        await expect(line.get_by_test_id("transfer-state")).to_have_text("cancelled")
        await expect(tab.by("files-flash")).to_have_text("film.bin was not downloaded: you cancelled it.")
        await wait_for(lambda: server.files.downloads.open == 0, timeout=10, what="the download let go")
        assert len(chunks.held) == 2 and not saved
        tab.assert_clean()


async def test_a_cancelled_download_whose_sign_in_ends_before_the_sprite_let_it_go_still_finishes(
        server: SpriteOS) -> None:
    """Sign out while a cancelled download waited for its `download_cancel` answer: a request of an ended
    sign-in never settles, so the download never finished (its chunks and listeners held for the page's
    life), and the view kept it among the downloads being let go. A connection of the page's own: the
    Sprite's answers are held or never come, as the test needs."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        said = await tab.page.evaluate("""async () => {
            const { FilesView } = await import("/console/js/files.js");
            const signIn = new AbortController();
            const waiting = {};  // a request's type -> its answer, given by the test (a download_cancel's: never)
            const conn = { signIn, request: (type) => new Promise((resolve) => {
                if (type === "download_start") resolve({ download_id: "d1", size: 4, name: "film.bin" });
                else waiting[type] = resolve;
            }) };
            const until = async (ok) => { while (!ok()) await new Promise((r) => setTimeout(r, 10)); };
            const view = new FilesView(document.createElement("section"), conn);
            const download = view.download("documents/film.bin", "film.bin").then(() => "finished");
            await until(() => waiting.download_chunk);
            view.progress.querySelector('[data-testid="transfer-cancel"]').click();
            waiting.download_chunk({ data: "", eof: true });  // the chunk on its way: then the Sprite is asked
            await until(() => waiting.download_cancel);
            signIn.abort();  // Sign out
            view.signOut();
            const hung = new Promise((r) => setTimeout(() => r("still waiting"), 2000));
            return { download: await Promise.race([download, hung]), letting: view.letting.size };
        }""")
        assert said == {"download": "finished", "letting": 0}
        tab.assert_clean()


async def test_a_download_asked_for_as_another_is_cancelled_waits_for_its_place(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download cancelled holds its place on the Sprite until its `download_cancel` is answered, which
    the page sends once the chunk on its way is back. A download asked for meanwhile, the connection's
    other places taken, was refused busy ("downloads are under way on this connection"): it waits for
    the cancel, then downloads."""
    documents = server.settings.layout.root / "documents"
    (documents / "first.bin").write_bytes(os.urandom(2 * files_frames.CHUNK_BYTES))
    (documents / "second.txt").write_bytes(b"asked for during a cancel")
    monkeypatch.setattr(server.files.downloads, "per_client", 1)  # every other place of the page's taken
    chunks = HeldFrames(monkeypatch, lambda frame: '"download_chunk"' in frame)  # a slow link for chunks
    asked: list[str] = []

    async def record(conn: gateway._Connection, frame: str) -> bool:
        if '"download_' in frame:
            asked.append(json.loads(frame)["type"])
        return False

    intercepted(monkeypatch, record)  # (sees each frame as it comes, a held one too)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        saved, first = await downloading(tab, "first.bin")
        await wait_for(lambda: len(chunks.held) == 1, timeout=30, what="the first chunk asked")
        await first.get_by_test_id("transfer-cancel").click()
        await expect(first).to_have_attribute("data-state", "cancelling")
        chunks.on = False
        await tab.page.locator('[data-name="second.txt"]').get_by_test_id("download").click()
        await expect(tab.by("files-flash")).to_have_text("second.txt starts once the cancelled download is let go.")
        await chunks.release()  # the chunk's answer comes: then the cancel goes
        await expect(first.get_by_test_id("transfer-state")).to_have_text("cancelled")
        second = tab.by("download-progress").filter(has_text="second.txt")
        await expect(second.get_by_test_id("transfer-state")).to_have_text("downloaded")
        await expect(tab.by("files-flash")).to_have_text("Downloaded second.txt.")
        assert asked == ["download_start", "download_chunk", "download_cancel", "download_start", "download_chunk"]
        assert len(saved) == 1
        tab.assert_clean()


async def test_an_upload_goes_on_after_a_dropped_connection_and_no_chunk_is_written_twice(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sprite_os.console import files_api

    data = os.urandom(3 * files_frames.CHUNK_BYTES - 1000)  # three chunks
    picked = tmp_path / "contract.pdf"
    picked.write_bytes(data)
    writes: list[int] = []
    pwrite = os.pwrite

    def counted(fd: int, chunk: bytes, offset: int) -> int:
        writes.append(offset)
        return pwrite(fd, chunk, offset)

    monkeypatch.setattr(files_api.os, "pwrite", counted)
    dropped: list[int] = []
    request = gateway._Connection._request

    async def lose_one_answer(conn: gateway._Connection, frame: object) -> None:
        if isinstance(frame, files_frames.UploadChunkRequest) and frame.offset > 0 and not dropped:
            dropped.append(frame.offset)
            assert conn.gw.requests is not None
            await conn.gw.requests(frame)  # the chunk is written...
            conn.ws.transport.abort()  # ...and its answer is lost with the connection
            return
        await request(conn, frame)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway._Connection, "_request", lose_one_answer)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("files-tab").click()
        await tab.by("upload-input").set_input_files(str(picked))
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done", timeout=60_000)
        assert (server.settings.layout.root / "documents" / "contract.pdf").read_bytes() == data
        assert dropped == [files_frames.CHUNK_BYTES]
        assert writes == [0, files_frames.CHUNK_BYTES, 2 * files_frames.CHUNK_BYTES]  # each chunk once
        tab.assert_clean("WebSocket")
