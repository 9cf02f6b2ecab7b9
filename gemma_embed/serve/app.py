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


async def read_json(request: Request, limit: int):
    """The body as JSON, refused (413) past `limit` bytes before more is read."""
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
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError):
        raise invalid("the request body is not valid JSON") from None


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

    def __init__(self, app, key: str | None, metrics: Metrics, log: Callable[[str], None] | None):
        self.app, self.key, self.metrics, self.log = app, key, metrics, log

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
            if self.key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                await self._refuse(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            self._record(scope, status["code"], time.perf_counter() - started)

    def _authorized(self, scope) -> bool:
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), None)
        return key_matches(header.decode("latin-1") if header is not None else None, self.key)

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


def make_app(service: Service, metrics: Metrics, log: Callable[[str], None] | None = None):
    """The ASGI application of a service: FastAPI's routes inside the Gate."""
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

    return Gate(app, service.settings.key(), metrics, log)
