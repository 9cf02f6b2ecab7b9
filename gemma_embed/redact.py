"""Secrets kept out of everything the tool writes and prints: a location is recorded, logged and named in errors
without what would let a reader fetch it in the user's name.

- A URL's user information (`https://user:password@host/`) and its query string and fragment (a signed URL's
  `?X-Amz-Signature=...&X-Amz-Credential=...`, a SAS token, `?token=...`) are dropped: `https://host/a.jpg`.
- The values of the credential variables the clients read (`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
  `HF_TOKEN`, ...) are replaced where they appear verbatim, whatever carried them there (a library's message, a
  traceback): `***`.

`redact` is applied where text leaves the tool: every line on stderr (`terminal.printable`), every failure record
(`errors.ItemError`: the errors file, --jsonl, a Ray row), an item's recorded `path` and warnings, and the keys of
URLs. A leaf module: it imports nothing of the package.
"""

from __future__ import annotations

import os
import re

# The credential variables of the clients the tool reaches object storage with (botocore, gcsfs/google-auth,
# huggingface_hub, adlfs), and the tool's own server key.
SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GEMMA_EMBED_API_KEY",
)
MASK = "***"
# Shorter values are no secrets worth masking (and masking "1" would mangle every line).
MIN_SECRET_CHARS = 8

# scheme://[userinfo@]rest-of-URL up to whitespace or a quote, less the punctuation a sentence puts after it (`URL:`);
# the userinfo and everything from ? or # go.
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+://)(?P<user>[^/\s'\"@?#]*@)?(?P<rest>(?:[^\s'\"<>]*[^\s'\"<>:;,.)\]])?)"
)


def _url(match: re.Match) -> str:
    rest = re.split(r"[?#]", match.group("rest"), maxsplit=1)[0]
    return match.group("scheme") + rest


def secrets() -> list[str]:
    """The credential values set in this process's environment now, longest first."""
    found = {os.environ.get(name, "") for name in SECRET_VARIABLES}
    return sorted((v for v in found if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def redact(text: str) -> str:
    """`text` without URL credentials, query strings and fragments, and without the environment's secrets."""
    text = str(text)
    if "://" in text:
        text = _URL.sub(_url, text)
    for secret in secrets():
        if secret in text:
            text = text.replace(secret, MASK)
    return text
