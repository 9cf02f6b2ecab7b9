"""What the routes do, without HTTP: embed a request's inputs through the batching queue, search a collection,
and wait for either while watching for the client to go away. No fastapi here (app.py is the HTTP side).

The model is the batch tool's: one `Embedder` built from the run options (`RunConfig`), loaded in the queue's
worker thread (batcher.py), every command the checkpoint's family supports loaded once at start. Each modality's
route is the one `gemma-embed text` / `images` / `video` / `audio` runs with the same options, so a served vector is
the one the batch tool writes: retrieval vectors for EmbeddingGemma (2); for the soft-token towers (Gemma 4, 3n),
which give many rows per item, the mean row (`--pool mean`), as `search` makes a media query of them.
`dimensions` truncates a retrieval vector and renormalises it (`pooling.truncate_dim`, the tool's `--dim`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from gemma_embed.config import RunConfig
from gemma_embed.errors import GemmaEmbedError, ItemError, UsageError
from gemma_embed.serve.batcher import Batcher, Closed, Job, QueueFull, RouteKey, TooLarge
from gemma_embed.serve.collections import Collection, Item
from gemma_embed.serve.media_urls import media_bytes, too_large
from gemma_embed.serve.openai_shapes import ApiError, SearchRequest, Wanted, invalid
from gemma_embed.serve.settings import ServeConfig
from gemma_embed.sources.base import Source

RETRY_SOON = {"Retry-After": "1"}


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class Service:
    """The model behind the queue, the collections, and what each route asks of them."""

    def __init__(
        self,
        config: RunConfig,
        settings: ServeConfig,
        collections: dict[str, Collection],
        observer=None,
        on_ready: Callable[[BaseException | None], None] | None = None,
    ):
        self.config = config
        self.settings = settings
        self.collections = collections
        self.model_id = str(config.model)
        self.created = time.time()
        self.routes: dict[str, dict] = {}  # modality -> the route options /v1/embeddings uses
        self.spaces: dict[str, str] = {}  # modality -> the space of its vectors
        self.widths: dict[str, int] = {}
        self.refused: dict[str, str] = {}  # modality -> why this checkpoint cannot embed it
        self.query_prompt: str | None = None  # the checkpoint's `query` prompt, for text searches
        self.item_limit = config.collection.with_item_limit().max_item_bytes
        self.batcher = Batcher(self._load, settings.queue_size, observer, on_ready)

    # ------------------------------------------------------------------------------------------ start, stop
    def start(self) -> None:
        self.batcher.start()

    @property
    def ready(self) -> bool:
        return self.batcher.ready.is_set() and self.batcher.failure is None

    def close(self, timeout: float | None) -> bool:
        return self.batcher.close(timeout)

    def _load(self):
        """In the worker thread: the Embedder, every command the checkpoint can run loaded, the collections'
        query settings checked."""
        from gemma_embed.config import Modality, Space
        from gemma_embed.embedder import Embedder
        from gemma_embed.models.registry import find_family

        embedder = Embedder.from_config(self.config)
        family = find_family(embedder.checkpoint.config)
        commands = list(family.commands) if family is not None else []
        for modality in Modality:
            if modality not in commands:
                self.refused[modality.value] = f"{family.name if family else 'this model'} embeds no {modality}"
                continue
            try:
                stages = embedder.stages(modality)
                options = {} if stages.space == Space.retrieval else {"pool": "mean"}
                route = embedder.load(modality, **options)
            except UsageError as exc:  # a checkpoint without that tower
                self.refused[modality.value] = str(exc)
                continue
            self.routes[modality.value] = options
            self.spaces[modality.value] = str(route.stages.space)
            self.widths[modality.value] = int(route.stages.width)
        if not self.routes:
            reasons = "; ".join(self.refused.values())
            raise UsageError(f"{self.model_id}: this checkpoint can embed nothing here ({reasons})")
        if "text" in self.routes:  # sentence-transformers' `encode_query` prompt, as `gemma-embed search` takes it
            from gemma_embed.models.st_inputs import read_sentence_transformers

            prompts = read_sentence_transformers(embedder.checkpoint).prompts or {}
            self.query_prompt = "query" if "query" in prompts else None
        for collection in self.collections.values():
            self._check_collection(embedder, collection)
        return embedder

    def _check_collection(self, embedder, collection: Collection) -> None:
        """The queries a collection takes (its own modality, text where it holds retrieval vectors) come out in its
        space and width, from the same model (`search.check_query_settings`)."""
        from gemma_embed.search import check_query_settings

        for modality in self._query_modalities(collection):
            options = self._query_options(collection, modality, None)
            stages = embedder.load(modality, **options).stages
            width = int(stages.width)
            dim = collection.dim
            made = {
                "model": embedder.config.model,
                "revision": embedder.config.revision or "",
                "space": str(stages.space),
                "dim": str(min(width, dim) if dim else width) if str(stages.space) == "retrieval" else "",
            }
            check_query_settings(collection.header, made, f"--output {collection.path}")
            if dim is not None and dim > width:
                raise UsageError(f"--output {collection.path}: holds {dim}-wide vectors; this model gives {width}")

    # ------------------------------------------------------------------------------------------ embeddings
    def _route(self, modality: str, prompt_name: str | None) -> RouteKey:
        if modality not in self.routes:
            reason = self.refused.get(modality) or f"this model embeds no {modality}"
            raise invalid(reason, "input", "unsupported_modality")
        options = dict(self.routes[modality])
        if prompt_name is not None:
            options.update(prompt_name=prompt_name, prompt=None)
        return RouteKey.of(modality, **options)

    def check_dimensions(self, wanted: list[Wanted], dimensions: int | None) -> None:
        if dimensions is None:
            return
        for modality in {w.modality for w in wanted}:
            if self.spaces.get(modality) != "retrieval":
                raise invalid(
                    f"dimensions: this model's {modality} vectors are mean soft tokens, not Matryoshka vectors",
                    "dimensions",
                )
            width = self.widths[modality]
            if dimensions > width:
                raise invalid(f"dimensions: at most {width} for this model, got {dimensions}", "dimensions")

    async def sources(self, wanted: list[Wanted]) -> list[Source]:
        """Each input as the engine takes it: text as a line's bytes, token ids as they are, media fetched or
        decoded from its URL (in threads: an http(s) fetch blocks)."""
        from gemma_embed.models.base import TokenIds

        async def one(w: Wanted) -> Source:
            if w.text is not None:
                return Source(w.param, w.param, data=w.text.encode("utf-8"))
            if w.ids is not None:
                return Source(w.param, w.param, value=TokenIds(w.ids))
            if w.data is None:
                data = await asyncio.to_thread(media_bytes, w.url, self.item_limit, w.param)
            elif len(w.data) > self.item_limit:
                raise too_large(len(w.data), self.item_limit, w.param)
            else:
                data = w.data
            return Source(w.param, w.param, data=data)

        return list(await asyncio.gather(*(one(w) for w in wanted)))

    def _check_ready(self) -> None:
        if self.batcher.failure is not None:
            raise ApiError(503, "the model failed to load", code="model_not_loaded")
        if not self.batcher.ready.is_set():
            raise ApiError(503, "the model is loading; retry shortly", code="model_loading", headers=RETRY_SOON)

    async def embed(
        self,
        wanted: list[Wanted],
        prompt_name: str | None,
        dimensions: int | None,
        until_gone: Callable[[], Awaitable[Any]],
    ) -> tuple[list[np.ndarray], int]:
        """Every input's vector, in order, and the tokens the model read (OpenAI's usage)."""
        self._check_ready()
        self.check_dimensions(wanted, dimensions)
        routes = [self._route(w.modality, prompt_name) for w in wanted]
        sources = await self.sources(wanted)
        results = await self._run(routes, sources, until_gone)
        return [_truncated(r.vector, dimensions) for r in results], sum(r.tokens for r in results)

    async def _run(self, routes: list[RouteKey], sources: list[Source], until_gone) -> list:
        """Sources through the queue (one job per route, admitted together), each one's result in order; an item
        that failed is the request's error, naming its input."""
        parts: dict[RouteKey, list[int]] = {}
        for place, route in enumerate(routes):
            parts.setdefault(route, []).append(place)
        order = list(parts.items())
        try:
            jobs = self.batcher.submit_many([(route, [sources[p] for p in places]) for route, places in order])
        except TooLarge as exc:
            raise ApiError(413, str(exc), "input", "too_many_inputs") from None
        except QueueFull as exc:
            raise ApiError(429, str(exc), code="queue_full", headers={"Retry-After": str(exc.retry_after)}) from None
        except Closed as exc:
            raise ApiError(503, str(exc), code="shutting_down") from None
        try:
            answers = await wait_for_jobs(self.batcher, jobs, until_gone)
        except UsageError as exc:  # the route cannot run (a prompt name the checkpoint lacks)
            raise invalid(str(exc)) from None
        except GemmaEmbedError as exc:  # the device failed
            raise ApiError(500, str(exc), code="model_failed") from None
        results: list = [None] * len(sources)
        for (_, places), answer in zip(order, answers, strict=True):
            for place, result in zip(places, answer, strict=True):
                if isinstance(result, ItemError):
                    raise _item_error(sources[place].path, result)
                results[place] = result
        return results

    # ------------------------------------------------------------------------------------------ search
    def collection(self, name: str | None) -> Collection:
        if name is None and len(self.collections) == 1:
            return next(iter(self.collections.values()))
        if name is None:
            names = ", ".join(self.collections) or "none (start the server with --output)"
            raise invalid(f"give 'output': one of {names}", "output")
        found = self.collections.get(name)
        if found is None:
            raise ApiError(404, f"no output named {name!r} is served", "output", "output_not_found")
        return found

    def _query_modalities(self, collection: Collection) -> list[str]:
        kinds = [collection.modality] if collection.modality in self.routes else []
        if collection.text_queries and "text" in self.routes and "text" not in kinds:
            kinds.append("text")
        return kinds

    def _query_options(self, collection: Collection, modality: str, prompt_name: str | None) -> dict:
        """The route a query of this collection takes: its space and pooling, the `query` prompt for text where the
        checkpoint has one (as `gemma-embed search`), the collection's image budget for its own kind of media."""
        options: dict[str, Any] = {"space": collection.space or "auto"}
        options["pool"] = "none" if collection.space == "retrieval" else "mean"
        if modality == collection.modality and modality in ("images", "video") and collection.max_soft_tokens:
            options["max_soft_tokens"] = int(collection.max_soft_tokens)
        if collection.space == "retrieval":
            name = prompt_name if prompt_name is not None else (self.query_prompt if modality == "text" else None)
            if name is not None:
                options.update(prompt_name=name, prompt=None)
        return options

    async def search(self, request: SearchRequest, until_gone) -> dict:
        """The answer of `/v1/search`: the collection's k nearest items, best first, with their keys, scores,
        metadata, captions and (images, video) thumbnail routes."""
        collection, hits = await self._search(request, until_gone)
        records = await asyncio.to_thread(lambda: [hit_record(collection, hit) for hit in hits])
        return {"object": "list", "output": collection.name, "model": collection.model, "data": records}

    async def _search(self, request: SearchRequest, until_gone) -> tuple[Collection, list]:
        collection = self.collection(request.output)
        if request.vector is not None:
            vector = request.vector
        else:
            self._check_ready()
            query = request.query
            if query.modality not in self._query_modalities(collection):
                raise invalid(
                    f"{collection.name} holds {collection.space} vectors of {collection.modality}, which "
                    f"{query.modality} queries cannot find",
                    "input",
                )
            options = self._query_options(collection, query.modality, request.prompt_name)
            sources = await self.sources([query])
            (result,) = await self._run([RouteKey.of(query.modality, **options)], sources, until_gone)
            vector = _truncated(result.vector, collection.dim)
        try:
            hits = await asyncio.to_thread(collection.search, vector, request.k, request.exact)
        except UsageError as exc:  # a vector of another width
            raise invalid(str(exc), "vector") from None
        return collection, hits


async def wait_for_jobs(batcher: Batcher, jobs: list[Job], until_gone: Callable[[], Awaitable[Any]]) -> list:
    """Every job's results, or ClientGone once `until_gone()` returns first (the jobs are then cancelled: a
    waiting one leaves the queue at once). Jobs are cancelled too when the request's own task is."""
    answers = asyncio.gather(*(asyncio.wrap_future(job.future) for job in jobs))
    gone = asyncio.ensure_future(until_gone())
    try:
        await asyncio.wait({answers, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not answers.done():
            raise ClientGone()
        return answers.result()
    except Closed as exc:
        raise ApiError(503, str(exc), code="shutting_down") from None
    finally:
        gone.cancel()
        if not answers.done():
            for job in jobs:
                batcher.cancel(job)
            answers.cancel()
        elif not answers.cancelled():
            answers.exception()  # retrieved: no "never retrieved" warning when it failed


def hit_record(collection: Collection, hit) -> dict:
    """One search hit as JSON: where it ranks and scores, the item's key, place, caption and metadata, and the
    route of its thumbnail (images and video with a file)."""
    place = collection.place(hit.key)
    return {
        "rank": hit.rank,
        "score": hit.score,
        "key": hit.key,
        "index": place,
        "path": hit.path,
        "caption": Item(hit.key, hit.item).caption,
        "frame": hit.frame,
        "timestamp": hit.timestamp,
        "metadata": hit.item,
        "thumbnail": collection.thumbnail_route(place, hit.path),
    }


def _truncated(vector: np.ndarray, dim: int | None) -> np.ndarray:
    if dim is None or dim >= vector.shape[0]:
        return vector
    import torch

    from gemma_embed.pooling import truncate_dim

    return truncate_dim(torch.from_numpy(np.ascontiguousarray(vector)), dim).numpy()


def _item_error(param: str, error: ItemError) -> ApiError:
    """A failed input as the request's answer: 400 when the input could not be read (decode, prepare), 500 when the
    model failed on it."""
    if error.stage == "encode":
        return ApiError(500, f"{param}: the model failed on this input: {error.message}", param, "encode_failed")
    return ApiError(400, f"{param}: {error.message}", param, "invalid_input")


def describe_model(service: Service) -> dict:
    return {
        "model": service.model_id,
        "modalities": sorted(service.routes),
        "spaces": dict(service.spaces),
        "widths": dict(service.widths),
    }
