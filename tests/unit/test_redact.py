"""Secrets kept out of what the tool writes and prints (gemma_embed/redact.py): a URL loses its credentials, query
string and fragment exactly as urllib splits them off, wherever it stands in a line; the credential variables'
values are masked wherever they appear."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest

from gemma_embed.redact import MASK, redact

URLS = [
    "https://bucket.s3.amazonaws.com/a/b.jpg?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101"
    "&X-Amz-Signature=0123abcd",
    "http://user:pa55word@127.0.0.1:8080/img/x.png#frag",
    "https://example.org/plain.webp",
    "https://storage.googleapis.com/b/o.jpg?GoogleAccessId=x&Signature=y%3D",
    "s3://bucket/key/with/no/query.tar",
]


def _expected(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@pytest.mark.parametrize("url", URLS)
def test_a_url_keeps_scheme_host_and_path_only(url):
    assert redact(url) == _expected(url)
    line = f"error: urls.parquet:3: cannot fetch {url}: HTTP 403 Forbidden"
    assert redact(line) == f"error: urls.parquet:3: cannot fetch {_expected(url)}: HTTP 403 Forbidden"
    quoted = f"row 2: {url!r} is no http(s) URL"
    assert redact(quoted) == f"row 2: {_expected(url)!r} is no http(s) URL"


def test_the_environments_credentials_are_masked_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "short")  # too short to be worth masking: left alone
    text = "botocore said wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY and hf_abcdefghijklmnopqrstuvwxyz; short"
    assert redact(text) == f"botocore said {MASK} and {MASK}; short"


def test_stderr_lines_and_failure_records_are_redacted(monkeypatch):
    from gemma_embed.errors import ItemError
    from gemma_embed.terminal import printable

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret-value-1234")
    error = ItemError(URLS[0], "fetch", f"cannot fetch {URLS[0]}: key another-secret-value-1234", "fetch-failed")
    assert error.key == _expected(URLS[0])
    assert error.as_record()["message"] == f"cannot fetch {_expected(URLS[0])}: key {MASK}"
    assert printable(f"note: {URLS[1]}\n") == f"note: {_expected(URLS[1])}\\n"
