"""OpenAI's embeddings API as plain data: the request read into `Wanted` inputs, the response and error bodies
(https://platform.openai.com/docs/api-reference/embeddings), and the same for `/v1/search`. No fastapi here.

Request: `input` is a string, a list of strings, a list of token ids, or a list of token id lists; `dimensions`
(Matryoshka truncation, renormalised), `encoding_format` (`float` or `base64`: little-endian float32, which the
official client asks for by default), `model`, `user`. Media, as infinity-emb and vLLM take them: a `modality`
field ("image", "video", "audio") makes each string a `data:` URL or an http(s) URL; an item may also be a content
part, `{"type": "image_url", "image_url": {"url": U}}` (likewise `video_url`, `audio_url`), `{"type": "text",
"text": T}` or `{"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}`, so one request can mix
kinds. `prompt_name` (as text-embeddings-inference takes it) picks one of the checkpoint's prompts.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

# The request's modality names (OpenAI-style singular, or the commands' names) -> the command.
MODALITIES = {
    "text": "text",
    "image": "images",
    "images": "images",
    "video": "video",
    "audio": "audio",
}
PART_TYPES = {"image_url": "images", "video_url": "video", "audio_url": "audio"}
ENCODINGS = ("float", "base64")
DEFAULT_K = 10
MAX_K = 1000


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""

    KINDS = {
        400: "invalid_request_error",
        401: "invalid_request_error",
        404: "invalid_request_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        500: "server_error",
        503: "server_error",
    }

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.status = status
        self.message = " ".join(str(message).split())
        self.param = param
        self.code = code
        self.headers = headers or {}
        super().__init__(self.message)

    def body(self) -> dict:
        kind = self.KINDS.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


@dataclass(frozen=True)
class Wanted:
    """One input to embed: text, token ids, or media (a data: URL or http(s) URL, or bytes given inline)."""

    modality: str  # the command: text, images, video, audio
    text: str | None = None
    ids: tuple[int, ...] | None = None
    url: str | None = None
    data: bytes | None = None
    param: str = "input"  # where it is in the request, for errors: input[3]


@dataclass(frozen=True)
class EmbeddingsRequest:
    inputs: list[Wanted]
    model: str | None
    encoding_format: str
    dimensions: int | None
    prompt_name: str | None


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def _modality(body: dict, field: str = "modality") -> str:
    value = body.get(field, "text")
    if not isinstance(value, str) or value.lower() not in MODALITIES:
        raise invalid(f"{field} must be one of text, image, video or audio, got {value!r}", field)
    return MODALITIES[value.lower()]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _one(value: Any, modality: str, param: str) -> Wanted:
    if isinstance(value, str):
        if modality == "text":
            if not value.strip():
                raise invalid(f"{param} is an empty string", param)
            return Wanted("text", text=value, param=param)
        return Wanted(modality, url=value, param=param)
    if _is_ids(value):
        if modality != "text":
            raise invalid(f"{param}: token ids are text; the request's modality is {modality}", param)
        if not value:
            raise invalid(f"{param} is an empty list of token ids", param)
        return Wanted("text", ids=tuple(value), param=param)
    if isinstance(value, dict):
        return _part(value, param)
    raise invalid(f"{param} must be a string, a list of token ids or a content part", param)


def _part(part: dict, param: str) -> Wanted:
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return _one(part["text"], "text", param)
    if kind in PART_TYPES:
        inner = part.get(kind)
        url = inner.get("url") if isinstance(inner, dict) else inner
        if not isinstance(url, str):
            raise invalid(f"{param}.{kind}.url must be a string", param)
        return Wanted(PART_TYPES[kind], url=url, param=param)
    if kind == "input_audio" and isinstance(part.get("input_audio"), dict):
        data = part["input_audio"].get("data")
        if not isinstance(data, str):
            raise invalid(f"{param}.input_audio.data must be base64 text", param)
        try:
            return Wanted("audio", data=base64.b64decode(data, validate=True), param=param)
        except (binascii.Error, ValueError):
            raise invalid(f"{param}.input_audio.data is not valid base64", param) from None
    raise invalid(
        f"{param}: a content part is text, image_url, video_url, audio_url or input_audio, got {kind!r}", param
    )


def read_inputs(body: dict, field: str = "input") -> list[Wanted]:
    """The request's inputs, in order (OpenAI's forms; a list of ints is one input of token ids)."""
    if field not in body:
        raise invalid(f"'{field}' is required", field)
    value, modality = body[field], _modality(body)
    if isinstance(value, list) and value and _is_ids(value):
        return [_one(value, modality, field)]
    if isinstance(value, list):
        if not value:
            raise invalid(f"'{field}' is an empty list", field)
        return [_one(item, modality, f"{field}[{i}]") for i, item in enumerate(value)]
    return [_one(value, modality, field)]


def _positive_int(body: dict, name: str, most: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (most is not None and value > most):
        bound = f" and at most {most}" if most is not None else ""
        raise invalid(f"{name} must be an integer of at least 1{bound}, got {value!r}", name)
    return value


def _optional_text(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(f"{name} must be a string", name)
    return value


def read_embeddings_request(body: Any) -> EmbeddingsRequest:
    body = _object(body)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise invalid(f"encoding_format must be float or base64, got {encoding!r}", "encoding_format")
    return EmbeddingsRequest(
        inputs=read_inputs(body),
        model=_optional_text(body, "model"),
        encoding_format=encoding,
        dimensions=_positive_int(body, "dimensions"),
        prompt_name=_optional_text(body, "prompt_name"),
    )


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as the response carries it: floats, or base64 of its little-endian float32 bytes."""
    values = np.asarray(vector, dtype="<f4")
    if encoding_format == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    return values.tolist()


def embeddings_response(vectors: list[np.ndarray], tokens: int, model: str, encoding_format: str) -> dict:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encode_vector(vector, encoding_format)}
            for index, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": int(tokens), "total_tokens": int(tokens)},
    }


def models_response(model: str, created: float) -> dict:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": int(created), "owned_by": "gemma-embed"}],
    }


# ------------------------------------------------------------------------------------------- /v1/search


@dataclass(frozen=True)
class SearchRequest:
    output: str | None
    query: Wanted | None  # a text or media query (embedded with the output's settings)
    vector: np.ndarray | None  # or a vector given as it is
    k: int
    exact: bool
    prompt_name: str | None


def read_search_request(body: Any) -> SearchRequest:
    """`{"output": NAME, "input": TEXT | URL | part, "modality": ..., "k": 10}` or `{"vector": [...]}`."""
    body = _object(body)
    vector = None
    query = None
    if "vector" in body:
        values = body["vector"]
        if not (isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values)):
            raise invalid("vector must be a non-empty list of numbers", "vector")
        vector = np.asarray(values, dtype=np.float32)
        if not np.isfinite(vector).all() or not np.any(vector):
            raise invalid("vector is zero or not finite", "vector")
    elif "input" in body:
        found = read_inputs(body)
        if len(found) != 1:
            raise invalid("search takes one query: give input as one string or content part", "input")
        query = found[0]
    else:
        raise invalid("give 'input' (a text, or media with 'modality') or 'vector'", "input")
    exact = body.get("exact", False)
    if not isinstance(exact, bool):
        raise invalid("exact must be true or false", "exact")
    return SearchRequest(
        output=_optional_text(body, "output"),
        query=query,
        vector=vector,
        k=_positive_int(body, "k", MAX_K) or DEFAULT_K,
        exact=exact,
        prompt_name=_optional_text(body, "prompt_name"),
    )


def now() -> float:
    return time.time()
