"""A fake Hugging Face hub on 127.0.0.1, for the tests that read `hf://` locations offline: a local folder served as
a dataset repository through exactly the HTTP endpoints huggingface_hub's HfFileSystem (2.4) calls to list, stat and
read it. A process reaches it with `HF_ENDPOINT` set to `FakeHub.endpoint` before huggingface_hub is imported (the
hub's constants read it once, at import: run the tool in a subprocess with it in the environment).

The endpoints, as huggingface_hub's hf_api.py and hf_file_system.py call them:
- `GET /api/datasets/ORG/NAME[/revision/REV]` (repo_info: whether the repository and revision exist);
- `GET /api/datasets/ORG/NAME/tree/REV[/QUOTED_PATH]?recursive=&expand=` (list_repo_tree), `PAGE` entries a page
  with a `Link: <...>; rel="next"` header to the next (cursor) page, entries in an order other than sorted (the
  Hub's order is not guaranteed); a path that is a file or missing is 404 `X-Error-Code: EntryNotFound`;
- `POST /api/datasets/ORG/NAME/paths-info/REV` (get_paths_info), form fields `paths` (repeated) and `expand`;
- `HEAD` and `GET /datasets/ORG/NAME/resolve/REV/PATH` (reads), with `Range: bytes=A-B` / `bytes=A-` answered 206
  with `Content-Range`, 416 past the end, and `ETag`, `X-Repo-Commit`, `Content-Length`, `Accept-Ranges` headers.
A private repository (`token=`) answers 401 `X-Error-Code: RepoNotFound` (as the Hub does) to any request without
`Authorization: Bearer TOKEN`. Every request is recorded (method, path, its Authorization and Range headers),
and the bytes of file content sent are counted (`sent`)."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from pathlib import Path

from remote_helpers import QuietHandler, local_server

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one commit of every repository served
PAGE = 4  # entries a tree page (the Hub's is 1000; small, so that a listing of a few files is paginated)


def _git_oid(data: bytes) -> str:
    """The git blob id of `data` (what the Hub gives as a file's `oid`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Dataset repositories (`repos`: "ORG/NAME" -> a local folder) served as the Hub serves them, at revision
    `main` (and its commit id, `COMMIT`). `requests` lists (method, path with query, Authorization, Range) of every
    request, in order."""

    def __init__(self, repos: dict[str, Path], token: str | None = None) -> None:
        self.repos = repos
        self.token = token
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.sent = 0  # bytes of file content sent (the bodies of `resolve` answers)
        self.lock = threading.Lock()
        hub = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                hub._answer(self)

            do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

        self.server, self.thread = local_server(Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------------------------------ the repository
    def _entries(self, repo: str) -> dict[str, Path]:
        """Every file and folder of a repository: path in the repo -> local path."""
        root = self.repos[repo]
        return {p.relative_to(root).as_posix(): p for p in root.rglob("*")}

    def _entry(self, path: str, local: Path) -> dict:
        if local.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "path": path}
        data = local.read_bytes()
        entry = {"type": "file", "oid": _git_oid(data), "size": len(data), "path": path}
        if not path.endswith((".txt", ".json", ".md")):  # binary files are LFS files on the Hub
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    # ------------------------------------------------------------------------------------------ HTTP
    def _answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append(
                (handler.command, handler.path, handler.headers.get("Authorization"), handler.headers.get("Range"))
            )
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        try:
            if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
                repo = "/".join(parts[2:4])
                self._check(handler, repo)
                if handler.command == "GET" and len(parts) == 4:
                    return self._json(handler, {"id": repo, "sha": COMMIT, "private": bool(self.token)})
                if handler.command == "GET" and parts[4] == "revision" and len(parts) == 6:
                    self._revision(urllib.parse.unquote(parts[5]))
                    return self._json(handler, {"id": repo, "sha": COMMIT, "private": bool(self.token)})
                if handler.command == "GET" and parts[4] == "tree" and len(parts) >= 6:
                    self._revision(urllib.parse.unquote(parts[5]))
                    path = urllib.parse.unquote("/".join(parts[6:]))
                    return self._tree(handler, repo, path, query)
                if handler.command == "POST" and parts[4] == "paths-info" and len(parts) == 6:
                    self._revision(urllib.parse.unquote(parts[5]))
                    return self._paths_info(handler, repo, body)
            if parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve":
                repo = "/".join(parts[1:3])
                self._check(handler, repo)
                self._revision(urllib.parse.unquote(parts[4]))
                if handler.command in ("GET", "HEAD"):
                    return self._resolve(handler, repo, urllib.parse.unquote("/".join(parts[5:])))
            self._error(handler, 405 if handler.command not in ("GET", "HEAD", "POST") else 404, "NotFound")
        except _Refused as refused:
            self._error(handler, refused.status, refused.code)

    def _check(self, handler, repo: str) -> None:
        if repo not in self.repos:
            raise _Refused(404, "RepoNotFound")
        if self.token is not None and handler.headers.get("Authorization") != f"Bearer {self.token}":
            raise _Refused(401, "RepoNotFound")

    def _revision(self, revision: str) -> None:
        if revision not in ("main", COMMIT):
            raise _Refused(404, "RevisionNotFound")

    def _tree(self, handler, repo: str, path: str, query: dict) -> None:
        entries = self._entries(repo)
        if path and (path not in entries or not entries[path].is_dir()):
            raise _Refused(404, "EntryNotFound")
        recursive = query.get("recursive", ["False"])[0].lower() == "true"
        prefix = f"{path}/" if path else ""
        found = [
            self._entry(name, local)
            for name, local in entries.items()
            if name.startswith(prefix) and (recursive or "/" not in name[len(prefix) :])
        ]
        found.sort(key=lambda e: e["path"], reverse=True)  # not the sorted order: the Hub guarantees none
        start = int(query.get("cursor", ["0"])[0])
        page = found[start : start + PAGE]
        headers = {}
        if start + PAGE < len(found):
            rest = {k: v[0] for k, v in query.items() if k != "cursor"} | {"cursor": str(start + PAGE)}
            split = urllib.parse.urlsplit(handler.path)
            headers["Link"] = f'<{self.endpoint}{split.path}?{urllib.parse.urlencode(rest)}>; rel="next"'
        self._json(handler, page, headers)

    def _paths_info(self, handler, repo: str, body: bytes) -> None:
        kind = handler.headers.get("Content-Type", "")
        if kind.startswith("application/json"):
            paths = json.loads(body)["paths"]
        else:
            paths = urllib.parse.parse_qs(body.decode())["paths"]
        entries = self._entries(repo)
        self._json(handler, [self._entry(p, entries[p]) for p in paths if p in entries])

    def _resolve(self, handler, repo: str, path: str) -> None:
        local = self._entries(repo).get(path)
        if local is None or not local.is_file():
            raise _Refused(404, "EntryNotFound")
        data = local.read_bytes()
        status, content_range, chunk = 200, None, data
        asked = handler.headers.get("Range")
        if asked:
            first, _, last = asked.removeprefix("bytes=").partition("-")
            start, end = int(first), (int(last) + 1 if last else len(data))
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            end = min(end, len(data))
            status, content_range, chunk = 206, f"bytes {start}-{end - 1}/{len(data)}", data[start:end]
        handler.send_response(status)
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        for name, value in (
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(len(chunk))),
            ("Accept-Ranges", "bytes"),
            ("ETag", etag),
            ("X-Repo-Commit", COMMIT),
            ("X-Linked-Etag", etag),
            ("X-Linked-Size", str(len(data))),
        ):
            handler.send_header(name, value)
        if content_range:
            handler.send_header("Content-Range", content_range)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(chunk)
            with self.lock:
                self.sent += len(chunk)

    def _json(self, handler, value, headers: dict | None = None) -> None:
        data = json.dumps(value).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("X-Repo-Commit", COMMIT)
        for name, header in (headers or {}).items():
            handler.send_header(name, header)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def _error(self, handler, status: int, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("X-Error-Code", code)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)


class _Refused(Exception):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status, self.code = status, code
