"""The gallery page (`GET /`), like clip-retrieval's front: a query box (text, or an image file), a grid of the
hits' thumbnails with their scores and captions. The page and its script and style are fixed files of the package
(static/): no string from a collection is in them. The script fetches `/v1/outputs` and `/v1/search` and puts every
string it gets into the page as text (`textContent`), never as HTML; thumbnails come from the server's own route,
which serves only items of the outputs it was started with.

Every answer carries the Content-Security-Policy below: scripts, styles, images and requests from this server only,
no inline script or style, no plugin, no frame, no form posted elsewhere; and `nosniff`, so a thumbnail or JSON body
is never taken for a script.
"""

from __future__ import annotations

import functools
from importlib import resources

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
STATIC_TYPES = {
    "gallery.js": "text/javascript; charset=utf-8",
    "gallery.css": "text/css; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",  # the Map and Duplicates views (collection_views.py's tables)
    "map.js": "text/javascript; charset=utf-8",
    "views.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PAGE = "gallery.html"


@functools.cache
def asset(name: str) -> bytes:
    """A file of static/ (the page, its script, its style), read once."""
    return resources.files("gemma_embed.serve").joinpath("static", name).read_bytes()
