"""Decode stage: file -> decoded media, plus the facts about the file that go into the output metadata."""

from __future__ import annotations

import hashlib
import os

_HASH_BLOCK = 1 << 20


def file_facts(path: str) -> dict:
    """Size, modification time and SHA-256 of the content: how `--resume` tells a changed file."""
    st = os.stat(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return {"bytes": st.st_size, "mtime": st.st_mtime, "sha256": digest.hexdigest()}
