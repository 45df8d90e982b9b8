"""The Sprite console: a single web page, served on the server's own port, to talk to the agent,
watch its cards, see, search, correct and roll back its memory, read and forget past sessions, and
browse, upload and download the person's files.

`static/` holds the page (hand-written HTML, CSS and ES modules: no build step); `pages.py`
answers the plain HTTP GETs that fetch it; `origin.py` decides which browser pages may open
the WebSocket. Everything the page shows comes over the authenticated WebSocket.
"""
