"""The API key: `Authorization: Bearer KEY` (API clients), or HTTP Basic with KEY as the password (what a browser
sends for the gallery after asking once), compared in constant time. The key is never logged, echoed or counted."""

from __future__ import annotations

import base64
import binascii
import hmac


def presented_key(authorization: str | None) -> str | None:
    """The key an Authorization header carries, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip()
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
        return decoded.partition(":")[2]
    return None


def key_matches(authorization: str | None, key: str) -> bool:
    """Whether the header carries `key`: `hmac.compare_digest`, whose time does not depend on where they differ."""
    given = presented_key(authorization)
    return given is not None and hmac.compare_digest(given.encode("utf-8"), key.encode("utf-8"))
