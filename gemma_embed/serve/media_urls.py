"""Media given by URL: the bytes of a `data:` URL or of an http(s) URL, never more than the item limit.

The limit is the batch tool's `--max-item-bytes` (a tar member or table cell read into memory): a larger item is
refused unread, 413, as `sources.base.item_too_large` words it. The bytes then go to the modality's own decoder,
which checks the format as it does for files (Pillow's decompression-bomb limit, PyAV, soundfile). Only `data:`,
`http:` and `https:` are taken: never a file path or `file:` URL, so a client cannot make the server read its own
disk. urllib follows redirects within http(s) only.
"""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.parse
import urllib.request

from gemma_embed.serve.openai_shapes import ApiError, invalid
from gemma_embed.sources.base import item_too_large

FETCH_TIMEOUT_S = 30.0
CHUNK_BYTES = 1 << 16
USER_AGENT = "gemma-embed-serve"


def too_large(size: int, limit: int, param: str) -> ApiError:
    return ApiError(413, f"{param}: {item_too_large(size, limit)}", param, "item_too_large")


def data_url_bytes(url: str, limit: int, param: str) -> bytes:
    """The bytes of `data:[<type>][;base64],<data>` (RFC 2397)."""
    head, comma, payload = url.partition(",")
    if not comma:
        raise invalid(f"{param}: a data: URL needs a comma before its data", param)
    if head.endswith(";base64"):
        estimate = len(payload) * 3 // 4
        if estimate > limit + 2:
            raise too_large(estimate, limit, param)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{param}: the data: URL's base64 is not valid", param) from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > limit:
        raise too_large(len(data), limit, param)
    return data


def fetch_bytes(url: str, limit: int, param: str, timeout: float = FETCH_TIMEOUT_S) -> bytes:
    """The body of an http(s) URL, read up to `limit` bytes (a longer one is refused without reading on)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the scheme is checked
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise too_large(int(declared), limit, param)
            chunks, size = [], 0
            while chunk := response.read(CHUNK_BYTES):
                size += len(chunk)
                if size > limit:
                    raise too_large(size, limit, param)
                chunks.append(chunk)
            return b"".join(chunks)
    except urllib.error.HTTPError as exc:
        raise invalid(f"{param}: fetching the URL answered {exc.code} {exc.reason}", param, "fetch_failed") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise invalid(f"{param}: cannot fetch the URL: {reason}", param, "fetch_failed") from None


def media_bytes(url: str, limit: int, param: str) -> bytes:
    """A media input's bytes from its URL: `data:` decoded here, http(s) fetched (blocking: run it in a thread)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return data_url_bytes(url, limit, param)
    if scheme in ("http", "https"):
        return fetch_bytes(url, limit, param)
    raise invalid(f"{param}: give media as a data: URL or an http(s) URL", param, "unsupported_url")
