"""The HTTP side: the FastAPI application, its routes, the API key, one access-log line per request, metrics.

Routes (docs/serve.md): `GET /health` (alive), `GET /ready` (model loaded), `GET /metrics`, `GET /v1/models`,
`POST /v1/embeddings`, `POST /v1/search`, `GET /v1/outputs`, `GET /v1/outputs/{name}/items/{n}/thumbnail`, the
gallery's map, duplicates and records (collection_views.py), and the gallery: `GET /` and `GET /static/{file}`.
With a key every route but `/health` asks for it (auth.py); the gallery's routes answer a missing key with HTTP
Basic's challenge, so a browser asks its user once.

The gate around the application is plain ASGI (not Starlette's BaseHTTPMiddleware, which would hide a client's
disconnect from the routes): it checks the key, adds the security headers (gallery.py) to every answer, and after
the answer logs one line and counts it. A request's path is logged without its query string, escaped; headers are
never logged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gemma_embed.serve import collection_views, gallery
from gemma_embed.serve.auth import key_matches
from gemma_embed.serve.metrics import Metrics
from gemma_embed.serve.openai_shapes import (
    ApiError,
    embeddings_response,
    invalid,
    models_response,
    read_embeddings_request,
    read_search_request,
)
from gemma_embed.serve.service import ClientGone, Service, describe_model

OPEN_PATHS = frozenset({"/health"})
BROWSER_PATHS = ("/", "/static/", "/v1/outputs/")  # answered with a Basic challenge, which a browser asks for
CLIENT_CLOSED = 499  # nginx's status for a client that closed its connection first


def _problem(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def check_json_type(request: Request) -> None:
    """A POST's body must say it is JSON (415 otherwise): a web page can send text/plain or a form to a server on
    its user's machine without asking first (no CORS preflight), but not application/json."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise ApiError(
            415,
            f"send the body as Content-Type: application/json (got {printable_header(kind) or 'none'})",
            code="unsupported_media_type",
        )


def printable_header(value: str) -> str:
    from gemma_embed.terminal import printable

    return printable(value[:60])


def check_strings(value) -> None:
    """400 when any string of a parsed body holds a lone surrogate (JSON's \\ud800 escape), which no text can be
    encoded with; walked without recursion (the parser has bounded the depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise invalid("the request body holds a lone surrogate (\\ud800-\\udfff): not text") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


async def read_json(request: Request, limit: int):
    """The body as JSON (415 unless it says so), refused (413) past `limit` bytes before more is read; 400 for a
    body that is not JSON, is not UTF-8, nests deeper than Python's parser goes or holds a lone surrogate."""
    check_json_type(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes, over the {limit} allowed", code="request_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is over the {limit} bytes allowed", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    try:
        body = json.loads(b"".join(chunks))
    except RecursionError:
        raise invalid("the request body nests too deeply") from None
    except UnicodeDecodeError:
        raise invalid("the request body is not valid UTF-8") from None
    except ValueError:
        raise invalid("the request body is not valid JSON") from None
    check_strings(body)
    return body


def until_gone(request: Request):
    """An awaitable that returns when the client disconnects (the body is read by then)."""

    async def wait() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return wait


class Gate:
    """Key check, security headers, access log and request metrics around the application (plain ASGI)."""

    def __init__(
        self,
        app,
        key: str | None,
        metrics: Metrics,
        log: Callable[[str], None] | None,
        hosts: frozenset[str] | None = None,
    ):
        self.app, self.key, self.metrics, self.log = app, key, metrics, log
        self.hosts = hosts  # the Host values taken (a server on a loopback address), None: any

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 500}

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in gallery.SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        try:
            if self.hosts is not None and self._host(scope) not in self.hosts:
                await self._misdirected(scope, receive, sending)
            elif self.key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                await self._refuse(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            self._record(scope, status["code"], time.perf_counter() - started)

    def _authorized(self, scope) -> bool:
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), None)
        return key_matches(header.decode("latin-1") if header is not None else None, self.key)

    @staticmethod
    def _host(scope) -> str:
        header = next((v for k, v in scope.get("headers", []) if k == b"host"), b"")
        return header.decode("latin-1").lower()

    async def _misdirected(self, scope, receive, send) -> None:
        """A Host that is not this loopback server's (DNS rebinding: a web page's name pointed at 127.0.0.1)."""
        error = ApiError(421, "the Host header does not name this server", code="misdirected_request")
        await JSONResponse(error.body(), status_code=421)(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        error = ApiError(401, "a valid API key is needed: Authorization: Bearer KEY", code="invalid_api_key")
        browser = scope["method"] == "GET" and scope["path"].startswith(BROWSER_PATHS)
        challenge = 'Basic realm="gemma-embed", charset="UTF-8"' if browser else "Bearer"
        response = JSONResponse(error.body(), status_code=401, headers={"WWW-Authenticate": challenge})
        await response(scope, receive, send)

    def _record(self, scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or "other"
        self.metrics.request(template, status, seconds)
        if self.log is not None:
            from gemma_embed.terminal import printable

            client = scope.get("client") or ("-", 0)
            version = scope.get("http_version", "1.1")
            self.log(
                f'{client[0]} "{scope["method"]} {printable(scope["path"])} HTTP/{version}" {status} '
                f"{1000 * seconds:.1f} ms"
            )


ITEMS_PAGE_MAX = 1000  # the most items one `GET /v1/outputs/{name}/items` answer lists


def loopback_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host values a server bound to a loopback address takes (its names with its port; without it on port 80);
    None for any other address (a name there is the operator's to choose)."""
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    names = ("localhost", "127.0.0.1", "[::1]")
    return frozenset(f"{name}:{port}" for name in names) | (frozenset(names) if port == 80 else frozenset())


def make_app(
    service: Service, metrics: Metrics, log: Callable[[str], None] | None = None, hosts: frozenset[str] | None = None
):
    """The ASGI application of a service: FastAPI's routes inside the Gate (`hosts`: the Host values taken, None:
    any)."""
    app = FastAPI(title="gemma-embed", docs_url=None, redoc_url=None, openapi_url=None)
    limit = service.settings.max_request_bytes

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return _problem(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        return _problem(
            ApiError(error.status_code, str(error.detail), code="not_found" if error.status_code == 404 else None)
        )

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, error: ClientGone):
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        return _problem(ApiError(500, f"internal error: {type(error).__name__}", code="internal_error"))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if service.ready:
            return {"status": "ready", **describe_model(service)}
        state = "failed" if service.batcher.failure is not None else "loading"
        return JSONResponse({"status": state}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models():
        return models_response(service.model_id, service.created)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        asked = read_embeddings_request(await read_json(request, limit))
        if asked.model is not None and asked.model != service.model_id:
            raise ApiError(
                404,
                f"the model {asked.model!r} is not served here (this server: {service.model_id!r})",
                "model",
                "model_not_found",
            )
        vectors, tokens = await service.embed(asked.inputs, asked.prompt_name, asked.dimensions, until_gone(request))
        return embeddings_response(vectors, tokens, service.model_id, asked.encoding_format)

    @app.post("/v1/search")
    async def search(request: Request):
        asked = read_search_request(await read_json(request, limit))
        return await service.search(asked, until_gone(request))

    @app.get("/v1/outputs")
    async def outputs():
        import asyncio

        described = await asyncio.to_thread(lambda: [c.describe() for c in service.collections.values()])
        return {"object": "list", "data": described}

    @app.get("/v1/outputs/{name}/items")
    async def items(name: str, offset: int = 0, limit: int = 24):
        """A page of the output's items in its order (the gallery shows the first on arrival), and how many."""
        import asyncio

        collection = service.collection(name)
        page = await asyncio.to_thread(collection.first_items, offset, min(limit, ITEMS_PAGE_MAX))
        return {"object": "list", "output": collection.name, "total": collection.size, "data": page}

    @app.get("/v1/outputs/{name}/items/{place}/thumbnail")
    async def thumbnail(name: str, place: str):
        import asyncio

        collection = service.collection(name)
        if not place.isdigit():  # a place in the output, nothing else
            raise ApiError(404, f"{name} has no item {place!r}", code="not_found")
        try:
            picture = await asyncio.to_thread(collection.thumbnail, int(place))
        except Exception as exc:  # noqa: BLE001 - a missing or unreadable file: this item has no picture
            raise ApiError(404, f"item {place} of {name}: no picture ({' '.join(str(exc).split())})") from None
        if picture is None:
            raise ApiError(404, f"{name} has no picture at item {place}", code="not_found")
        return Response(picture, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=3600"})

    collection_views.add_routes(app, service)  # the gallery's Map and Duplicates views

    @app.get("/")
    async def page():
        return Response(gallery.asset(gallery.PAGE), media_type="text/html; charset=utf-8")

    @app.get("/static/{name}")
    async def static(name: str):
        if name not in gallery.STATIC_TYPES:
            raise ApiError(404, "no such file", code="not_found")
        return Response(gallery.asset(name), media_type=gallery.STATIC_TYPES[name])

    return Gate(app, service.settings.key(), metrics, log, hosts)
