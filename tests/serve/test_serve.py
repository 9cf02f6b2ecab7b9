"""`gemma-embed serve` as its users meet it: one server (tiny EmbeddingGemma 2, an API key, a captioned image
collection) started on a free port of 127.0.0.1, called with the unmodified official `openai` client and plain HTTP,
and its gallery driven in Chromium; the numbers are checked against the command line's own output files and numpy.
The last test stops it with Ctrl-C while a request is in flight."""

from __future__ import annotations

import base64
import functools
import http.client
import http.server
import io
import json
import secrets
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser

import numpy as np
import psutil
import pytest
from serve_helpers import (
    HOSTILE_CAPTION,
    TEXTS,
    TINY_EG2,
    ServerProcess,
    call,
    call_json,
    chromium_browser,
    finish,
    metrics,
    run_cli,
    write_captioned_images,
)

pytestmark = pytest.mark.serve
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
from gemma_embed.serve.media_urls import FETCH_FAILED  # noqa: E402 - after the extra is known to be there

KEY = "k-" + secrets.token_hex(12)
MODEL = str(TINY_EG2)
TOLERANCE = 1e-6  # a served vector against the command line's (the batch composition must not matter)
QUEUE = 100
ITEM_LIMIT = 300 << 10  # --max-item-bytes 300KiB
BODY_LIMIT = 2 << 20  # --max-request-bytes 2MiB


def _read_output(path) -> tuple[np.ndarray, list[str], list[dict]]:
    from safetensors import safe_open

    with safe_open(str(path), "np") as fh:
        header = fh.metadata()
        return fh.get_tensor("embeddings"), json.loads(header["keys"]), json.loads(header["items"])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The collection and the texts embedded by the command line, then the server over the same model."""
    folder = tmp_path_factory.mktemp("serve")
    table = write_captioned_images(folder / "gallery")
    gallery = folder / "gallery.safetensors"
    lines = folder / "texts.txt"
    lines.write_text("".join(t + "\n" for t in TEXTS))
    texts_out = folder / "texts.safetensors"
    images = run_cli(
        "images", str(table), "--column", "image", "--keep-columns", "caption", "--model", MODEL, "-o", str(gallery)
    )
    text = run_cli("text", str(lines), "--model", MODEL, "-o", str(texts_out))
    finish(images)
    finish(run_cli("index", str(gallery), "--kind", "hnsw", "-q"))  # searched through faiss, as `search` does
    server = ServerProcess(
        "--model", MODEL, "--output", str(gallery), "--queue-size", str(QUEUE),
        "--max-item-bytes", "300KiB", "--max-request-bytes", "2MiB", "--allowed-media-domains", "127.0.0.1",
        env={"GEMMA_EMBED_API_KEY": KEY},
    )  # fmt: skip
    try:
        finish(text)
        server.ready()
        yield {
            "server": server,
            "texts": _read_output(texts_out),
            "gallery": _read_output(gallery),
            "gallery_path": gallery,
            "folder": folder / "gallery",
        }
    finally:
        server.kill()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served["server"].url + "/v1", api_key=KEY, max_retries=0)


AUTH = {"Authorization": f"Bearer {KEY}"}


def _vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in sorted(response.data, key=lambda d: d.index)], dtype=np.float32)


def test_a_string_and_a_list_give_the_command_lines_vectors(served, client):
    vectors, keys, items = served["texts"]
    one = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert np.abs(_vectors(one)[0] - vectors[0]).max() <= TOLERANCE
    assert one.usage.prompt_tokens == items[0]["tokens"] == one.usage.total_tokens
    every = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in every.data] == list(range(len(TEXTS)))
    assert np.abs(_vectors(every) - vectors).max() <= TOLERANCE
    assert every.usage.prompt_tokens == sum(item["tokens"] for item in items)
    assert every.model == MODEL and every.object == "list"


def test_dimensions_are_the_first_components_renormalised(served, client):
    vectors, _, _ = served["texts"]
    short = _vectors(client.embeddings.create(model=MODEL, input=TEXTS[:3], dimensions=64))
    expected = vectors[:3, :64] / np.linalg.norm(vectors[:3, :64], axis=1, keepdims=True)
    assert short.shape == (3, 64)
    assert np.abs(short - expected).max() <= TOLERANCE
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MODEL, input="x", dimensions=vectors.shape[1] + 1)


def test_the_clients_default_is_base64_of_little_endian_float32(served):
    import httpx2

    sent = []
    hooked = httpx2.Client(event_hooks={"request": [lambda request: sent.append(json.loads(request.content))]})
    default = openai.OpenAI(base_url=served["server"].url + "/v1", api_key=KEY, http_client=hooked, max_retries=0)
    through_client = _vectors(default.embeddings.create(model=MODEL, input=TEXTS[1]))
    assert sent[-1]["encoding_format"] == "base64"  # what the official client asks for when not told
    status, floats = call_json(served["server"], "POST", "/v1/embeddings", {"input": TEXTS[1]}, AUTH)
    status64, packed = call_json(
        served["server"], "POST", "/v1/embeddings", {"input": TEXTS[1], "encoding_format": "base64"}, AUTH
    )
    assert status == status64 == 200
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == floats["data"][0]["embedding"] == through_client[0].tolist()


def test_a_wrong_or_missing_key_is_refused_and_never_shown(served):
    server = served["server"]
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="not-" + KEY, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model=MODEL, input="a cat")
    status, headers, body = call(server, "POST", "/v1/embeddings", {"input": "a cat"})
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    for path in ("/v1/models", "/ready", "/metrics", "/v1/outputs", "/"):
        assert call(server, "GET", path)[0] == 401, path
    assert call(server, "GET", "/")[1]["www-authenticate"].startswith("Basic")  # a browser asks its user
    assert call(server, "GET", "/health")[0] == 200  # liveness needs no key
    basic = base64.b64encode(f"gallery:{KEY}".encode()).decode()
    assert call(server, "GET", "/v1/models", headers={"Authorization": f"Basic {basic}"})[0] == 200
    text = call(server, "GET", "/metrics", headers=AUTH)[2].decode()
    assert KEY not in text and KEY not in "\n".join(server.stderr) and KEY not in body.decode()


def test_64_requests_from_16_concurrent_clients_each_get_their_own_vectors(served):
    url = served["server"].url + "/v1"
    texts = [f"{TEXTS[i % len(TEXTS)]} (variant {i})" for i in range(64)]
    single_client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    alone = [_vectors(single_client.embeddings.create(model=MODEL, input=t))[0] for t in texts]
    clients = [openai.OpenAI(base_url=url, api_key=KEY, max_retries=0) for _ in range(16)]
    start = threading.Barrier(16)

    def one_client(number: int) -> list[tuple[int, np.ndarray]]:
        start.wait(60)
        mine = range(number, 64, 16)
        return [(i, _vectors(clients[number].embeddings.create(model=MODEL, input=texts[i]))[0]) for i in mine]

    with ThreadPoolExecutor(16) as pool:
        answers = [pair for part in pool.map(one_client, range(16)) for pair in part]
    assert sorted(i for i, _ in answers) == list(range(64))
    for i, vector in answers:
        assert np.abs(vector - alone[i]).max() <= TOLERANCE, texts[i]
    # each text's own vector, not a neighbour's: every two differ by far more than the tolerance
    stacked = np.stack(alone)
    gaps = np.abs(stacked[:, None, :] - stacked[None, :, :]).max(axis=2) + np.eye(64)
    assert gaps.min() > 100 * TOLERANCE


def test_token_ids_are_the_models_input_as_given(served, client):
    from sentence_transformers import SentenceTransformer

    ids = SentenceTransformer(MODEL, device="cpu").tokenize([TEXTS[2]])["input_ids"][0].tolist()
    vectors, _, _ = served["texts"]
    by_ids = client.embeddings.create(model=MODEL, input=ids)  # one list of ints: one input
    assert np.abs(_vectors(by_ids)[0] - vectors[2]).max() <= TOLERANCE
    assert by_ids.usage.prompt_tokens == len(ids)
    two = client.embeddings.create(model=MODEL, input=[ids, ids[:5]])
    assert len(two.data) == 2 and np.abs(_vectors(two)[0] - vectors[2]).max() <= TOLERANCE


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"input": []}, 400, None),
        ({"input": ""}, 400, None),
        ({"input": "x", "encoding_format": "xml"}, 400, None),
        ({"input": "x", "model": "text-embedding-3-small"}, 404, "model_not_found"),
        ({"input": [10**9]}, 400, "invalid_input"),  # outside the vocabulary
        ({"input": ["data:image/png;base64,AAAA"], "modality": "image"}, 400, "invalid_input"),  # not an image
        ({"input": ["file:///etc/passwd"], "modality": "image"}, 400, "unsupported_url"),
        ({"input": ["/etc/passwd"], "modality": "image"}, 400, "unsupported_url"),
        ({"input": ["x"], "prompt_name": "no-such-prompt"}, 400, None),
        ({"input": ["x"] * (QUEUE + 1)}, 413, "too_many_inputs"),
        ({"input": ["data:image/png;base64," + "A" * (ITEM_LIMIT * 2)], "modality": "image"}, 413, "item_too_large"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(served, body, status, code):
    got, answer = call_json(served["server"], "POST", "/v1/embeddings", body, AUTH)
    assert got == status, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    assert KEY not in json.dumps(answer)


def test_a_body_over_the_limit_and_a_body_that_is_no_json(served):
    server = served["server"]
    status, _, body = call(server, "POST", "/v1/embeddings", b'{"input": "' + b"a" * BODY_LIMIT + b'"}', AUTH)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert call(server, "POST", "/v1/embeddings", b"{not json", AUTH)[0] == 400
    status, answer = call_json(server, "GET", "/no/such/route", headers=AUTH)
    assert status == 404 and answer["error"]["type"] == "invalid_request_error"


def _data_url(path) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()


@pytest.fixture(scope="module")
def image_site(served):
    """The collection's folder over http on 127.0.0.1 (a URL the server fetches)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served["folder"])))
    threading.Thread(target=site.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()


def test_images_by_data_url_and_http_url_give_the_command_lines_vectors(served, client, image_site):
    vectors, _, items = served["gallery"]
    texts, _, _ = served["texts"]
    landscape = served["folder"] / "landscape.jpg"
    by_data = client.embeddings.create(model=MODEL, input=[_data_url(landscape)], extra_body={"modality": "image"})
    assert np.abs(_vectors(by_data)[0] - vectors[0]).max() <= TOLERANCE
    assert by_data.usage.prompt_tokens == items[0]["tokens"]
    mixed = client.embeddings.create(
        model=MODEL,
        input=[
            {"type": "image_url", "image_url": {"url": f"{image_site}/square.webp"}},
            {"type": "text", "text": TEXTS[0]},
            {"type": "image_url", "image_url": {"url": f"{image_site}/portrait.png"}},
        ],
    )
    got = _vectors(mixed)
    assert np.abs(got[0] - vectors[2]).max() <= TOLERANCE
    assert np.abs(got[1] - texts[0]).max() <= TOLERANCE
    assert np.abs(got[2] - vectors[1]).max() <= TOLERANCE
    with pytest.raises(openai.BadRequestError) as missing:  # a 404 is told as every failed fetch is
        client.embeddings.create(model=MODEL, input=[f"{image_site}/missing.png"], extra_body={"modality": "image"})
    assert missing.value.body["message"] == f"input[0]: {FETCH_FAILED}"


def test_search_by_text_image_and_vector_ranks_as_numpy_does(served, client):
    vectors, keys, items = served["gallery"]
    server = served["server"]
    query = _vectors(client.embeddings.create(model=MODEL, input="a red square", extra_body={"prompt_name": "query"}))
    status, found = call_json(server, "POST", "/v1/search", {"input": "a red square", "k": 2}, AUTH)
    assert status == 200 and found["output"] == "gallery" and len(found["data"]) == 2
    cosines = vectors @ query[0] / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query[0])
    order = np.argsort(-cosines)[:2]
    assert [hit["key"] for hit in found["data"]] == [keys[i] for i in order]
    assert np.allclose([hit["score"] for hit in found["data"]], cosines[order], atol=1e-5)
    assert [hit["index"] for hit in found["data"]] == order.tolist()
    assert found["data"][0]["metadata"]["caption"] == items[order[0]]["caption"]
    portrait = _data_url(served["folder"] / "portrait.png")
    status, by_image = call_json(server, "POST", "/v1/search", {"input": portrait, "modality": "image", "k": 3}, AUTH)
    assert by_image["data"][0]["key"] == keys[1] and by_image["data"][0]["score"] == pytest.approx(1.0, abs=1e-5)
    status, by_vector = call_json(server, "POST", "/v1/search", {"vector": vectors[2].tolist(), "k": 1}, AUTH)
    assert by_vector["data"][0]["key"] == keys[2] and by_vector["data"][0]["caption"] == "a square picture"
    assert call_json(server, "POST", "/v1/search", {"vector": [1.0, 2.0], "k": 1}, AUTH)[0] == 400  # wrong width
    assert call_json(server, "POST", "/v1/search", {"input": "x", "output": "nope"}, AUTH)[0] == 404
    status, exact = call_json(server, "POST", "/v1/search", {"input": "a red square", "k": 2, "exact": True}, AUTH)
    assert [hit["key"] for hit in exact["data"]] == [hit["key"] for hit in found["data"]]
    status, listed = call_json(server, "GET", "/v1/outputs", headers=AUTH)
    assert listed["data"] == [
        {"name": "gallery", "model": MODEL, "modality": "images", "space": "retrieval", "items": 3,
         "text_queries": True, "index": "hnsw"}
    ]  # fmt: skip


def test_thumbnails_are_only_the_collections_items(served):
    from PIL import Image

    server = served["server"]
    status, headers, body = call(server, "GET", "/v1/outputs/gallery/items/1/thumbnail", headers=AUTH)
    assert status == 200 and headers["content-type"] == "image/jpeg"
    picture = Image.open(io.BytesIO(body))
    source = Image.open(served["folder"] / "portrait.png")
    assert max(picture.size) <= 224 and picture.size[0] / picture.size[1] == pytest.approx(
        source.size[0] / source.size[1], rel=0.02
    )
    secret = served["folder"].parent / "secret.txt"
    secret.write_text("root:do-not-serve")
    for path in [
        "/v1/outputs/gallery/items/3/thumbnail",
        "/v1/outputs/gallery/items/-1/thumbnail",
        "/v1/outputs/gallery/items/0x1/thumbnail",
        "/v1/outputs/../../../../etc/passwd",
        "/v1/outputs/gallery/items/../../../secret.txt",
        "/v1/outputs/..%2F..%2Fsecret.txt/items/0/thumbnail",
        "/v1/outputs/%2e%2e/items/0/thumbnail",
        f"/v1/outputs/{secret}/items/0/thumbnail",
        "/static/..%2Fapp.py",
        "/static/../app.py",
        "/static/gallery.html/../../settings.py",
        "/static/%2e%2e%2fserve%2fapp.py",
    ]:
        status, _, body = call(server, "GET", path, headers=AUTH)
        assert status == 404, path
        assert b"do-not-serve" not in body and b"import" not in body and b"root:" not in body


SCRIPTS = ["/static/gallery.js", "/static/views.js", "/static/map.js"]  # the page's scripts: the server's files only


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts, self.handlers = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts.append(dict(attrs).get("src"))
        self.handlers += [name for name, _ in attrs if name.startswith("on")]


def test_the_gallery_page_has_no_inline_script_and_a_strict_policy(served):
    status, headers, body = call(served["server"], "GET", "/", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/html")
    policy = dict(part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["script-src"] == "'self'"
    assert policy["img-src"] == "'self'" and policy["connect-src"] == "'self'"
    page = _Page()
    page.feed(body.decode())
    assert page.scripts == SCRIPTS and page.handlers == []
    assert headers["x-content-type-options"] == "nosniff"
    for name in SCRIPTS:
        status, headers, script = call(served["server"], "GET", name, headers=AUTH)
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        assert b"innerHTML" not in script and b"insertAdjacentHTML" not in script  # strings reach the page as text


def test_health_ready_models_and_metrics(served, client):
    server = served["server"]
    assert call_json(server, "GET", "/health") == (200, {"status": "ok"})
    status, ready = call_json(server, "GET", "/ready", headers=AUTH)
    assert status == 200 and ready["status"] == "ready" and "text" in ready["modalities"]
    assert [m.id for m in client.models.list().data] == [MODEL]
    client.embeddings.create(model=MODEL, input=TEXTS[:4])
    samples = metrics(call(server, "GET", "/metrics", headers=AUTH)[2].decode())
    assert samples['gemma_embed_requests_total{route="/v1/embeddings",status="200"}'] >= 1
    assert samples['gemma_embed_request_seconds_count{route="/v1/embeddings"}'] >= 1
    assert samples["gemma_embed_batch_items_sum"] >= 4 and samples["gemma_embed_batch_items_count"] >= 1
    assert samples["gemma_embed_batch_requests_count"] >= 1
    assert samples["gemma_embed_queue_items"] == 0
    assert samples["gemma_embed_items_total"] >= 4 and samples["gemma_embed_items_per_second"] > 0


def test_one_access_log_line_per_request(served):
    server = served["server"]
    probe = f"/probe-{uuid.uuid4().hex}"
    assert call(server, "GET", probe + "?secret=query-string", headers=AUTH)[0] == 404
    lines = server.wait_for_line(probe)
    assert len(lines) == 1 and f'"GET {probe} HTTP/1.1" 404' in lines[0]
    assert "secret=query-string" not in lines[0] and lines[0].startswith("127.0.0.1 ")


# ------------------------------------------------------------------------------------------ the gallery

expect = None  # playwright's expect, set by the chromium fixture (playwright is imported only where it is used)


@pytest.fixture(scope="module")
def chromium():
    global expect
    with chromium_browser() as (browser, expect):
        yield browser


@pytest.mark.browser
def test_the_gallery_answers_a_query_with_thumbnails_and_shows_captions_as_text(served, chromium):
    context = chromium.new_context(http_credentials={"username": "gallery", "password": KEY})
    page = context.new_page()
    dialogs, problems = [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(served["server"].url + "/")
    page.wait_for_selector("#output option", state="attached")
    page.fill("#text", "a picture of something")
    page.click("#go")
    figures = page.locator("#grid figure")
    expect(figures).to_have_count(3)
    # each thumbnail decoded: img.decode() settles once the picture has loaded (or rejects if it cannot)
    widths = page.locator("#grid img").evaluate_all(
        "images => Promise.all(images.map(i => i.decode())).then(() => images.map(i => i.naturalWidth))"
    )
    assert len(widths) == 3 and all(0 < width <= 224 for width in widths)
    captions = page.locator("#grid .caption").all_text_contents()
    assert HOSTILE_CAPTION in captions  # shown as the text it is
    assert page.locator("script").evaluate_all("nodes => nodes.map(n => n.getAttribute('src'))") == SCRIPTS
    assert page.locator("#grid img[src='x']").count() == 0  # the caption's <img> is no element
    expect(page.locator("#status")).to_contain_text("3 results from gallery")
    page.set_input_files("#image", str(served["folder"] / "square.webp"))  # an image query: itself first
    page.click("#go")
    expect(page.locator("#grid .caption").first).to_have_text("a square picture")
    assert dialogs == [] and problems == []
    context.close()


@pytest.mark.browser
def test_the_gallery_shows_the_collections_first_items_and_its_size_on_arrival(served, chromium):
    context = chromium.new_context(http_credentials={"username": "gallery", "password": KEY})
    page = context.new_page()
    problems = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(served["server"].url + "/")
    keys = served["gallery"][1]
    expect(page.locator("#grid figure")).to_have_count(3)  # before any query: the collection itself
    expect(page.locator("#status")).to_have_text("3 items in gallery (all shown); search to rank them")
    assert page.locator("#grid .key").all_text_contents() == keys  # in the output's order
    assert HOSTILE_CAPTION in page.locator("#grid .caption").all_text_contents()  # as text
    widths = page.locator("#grid img").evaluate_all(
        "images => Promise.all(images.map(i => i.decode())).then(() => images.map(i => i.naturalWidth))"
    )
    assert len(widths) == 3 and all(0 < width <= 224 for width in widths)
    page.fill("#k", "2")  # a smaller page: the first two, and the size still said
    page.dispatch_event("#output", "change")
    expect(page.locator("#grid figure")).to_have_count(2)
    expect(page.locator("#status")).to_have_text("3 items in gallery (the first 2 shown); search to rank them")
    assert problems == []
    context.close()


def test_a_page_of_items_in_the_outputs_order(served):
    server, keys = served["server"], served["gallery"][1]
    status, listed = call_json(server, "GET", "/v1/outputs/gallery/items?offset=1&limit=5", headers=AUTH)
    assert status == 200 and listed["total"] == 3 and listed["output"] == "gallery"
    assert [item["key"] for item in listed["data"]] == keys[1:]
    assert [item["index"] for item in listed["data"]] == [1, 2]
    assert listed["data"][-1]["caption"] == "a square picture"
    assert listed["data"][-1]["thumbnail"] == "/v1/outputs/gallery/items/2/thumbnail"
    assert call_json(server, "GET", "/v1/outputs/nope/items", headers=AUTH)[0] == 404
    assert call(server, "GET", "/v1/outputs/gallery/items")[0] == 401  # the key, as every route but /health


# ------------------------------------------------------------------------------------------ the stop (last)


def test_ctrl_c_finishes_the_request_in_flight_then_exits_0(served):
    server = served["server"]
    vectors, _, _ = served["texts"]
    body = json.dumps({"input": TEXTS[3]}).encode()
    connection = http.client.HTTPConnection(*server.address, timeout=120)
    connection.putrequest("POST", "/v1/embeddings")
    for name, value in {**AUTH, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
        connection.putheader(name, value)
    connection.endheaders(body[:10])  # in flight: the server is reading its body
    # ... once the server has accepted the connection: until then it waits in the listening socket's backlog,
    # which Ctrl-C closes (a reset, not a request in flight; seen once beside a busy suite). The accepted socket
    # is among the server process's own connections.
    ours = connection.sock.getsockname()
    accepted = time.monotonic() + 60  # only against a hang
    while not any(c.raddr and tuple(c.raddr) == ours for c in psutil.Process(server.pid).net_connections("tcp")):
        assert time.monotonic() < accepted, "the server never accepted the connection"
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # stopped accepting: the listening socket is closed
        try:
            socket.create_connection(server.address, timeout=5).close()
        except OSError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("still accepting connections after Ctrl-C")
    connection.send(body[10:])
    response = connection.getresponse()
    assert response.status == 200
    answer = json.loads(response.read())
    assert np.abs(np.array(answer["data"][0]["embedding"]) - vectors[3]).max() <= TOLERANCE
    assert server.proc.wait(120) == 0
    assert server.wait_for("stopped", timeout=10)["type"] == "stopped"
