"""The gallery's Map and Duplicates views (issue 49): the routes that serve an output's map and duplicate groups from
the parquet tables kept beside it, and both views driven in Chromium.

The collection is made by the real command line: the sample images, each copied three times under other names (one
name holding markup), with captions (one hostile). The map and groups tables are written here with the contract's
columns (gemma_embed.collection), at planted places: three clusters far apart, so where each point must be drawn is
known; each image's three copies are one group. A second output (texts) has no table."""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil

import numpy as np
import pytest
from serve_helpers import (
    HOSTILE_CAPTION,
    SAMPLE_IMAGES,
    TEXTS,
    TINY_EG2,
    ServerProcess,
    call,
    call_json,
    chromium_browser,
    finish,
    run_cli,
)

pytestmark = pytest.mark.serve
pytest.importorskip("fastapi")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

KEY = "k-" + secrets.token_hex(12)
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = str(TINY_EG2)
MARKUP_NAME = "<img src=x onerror=alert(1)>.jpg"  # a file name the page must show as text
SOURCES = ["landscape.jpg", "portrait.png", "square.webp"]
CLUSTER_NAMES = ["landscapes", "<b>portraits</b> & co", "squares"]  # cluster 1's name holds markup too
CENTRES = [(-10.0, -10.0), (10.0, -10.0), (0.0, 10.0)]  # the planted clusters, far apart


def _output_keys(path) -> tuple[list[str], list[dict]]:
    from safetensors import safe_open

    with safe_open(str(path), "np") as fh:
        header = fh.metadata()
    return json.loads(header["keys"]), json.loads(header["items"])


def _write_table(columns: dict, path, output, kind: str) -> None:
    """A table as `gemma-embed map` / `dedup` keep it: with their record of the output it was made from, where this
    build's library writes one (so that it takes the table as current rather than computing its own)."""
    table = pa.table(columns)
    try:
        from gemma_embed.collection import tables
    except ImportError:  # a build whose library keeps no record: the table is read as it is
        tables = None
    if tables is not None:
        record = {"format": tables.MAP_FORMAT if kind == "map" else tables.GROUPS_FORMAT}
        record["output"] = tables.output_fingerprint(output)
        table = table.replace_schema_metadata({tables.RECORD_KEY: json.dumps(record).encode()})
    pq.write_table(table, str(path))


@pytest.fixture(scope="module")
def viewed(tmp_path_factory):
    """Nine images (three copies of three), their map and groups tables, a text output without any, the server."""
    from gemma_embed.collection import GROUP_COLUMNS, MAP_COLUMNS, groups_path, map_path

    folder = tmp_path_factory.mktemp("views")
    images = folder / "images"
    images.mkdir()
    names, captions, source_of = [], [], []
    for copy in range(3):
        for number, source in enumerate(SOURCES):
            name = MARKUP_NAME if (copy, number) == (1, 0) else f"{copy}-{source}"
            shutil.copy(SAMPLE_IMAGES / source, images / name)
            names.append(name)
            captions.append(HOSTILE_CAPTION if (copy, number) == (0, 0) else f"copy {copy} of {source}")
            source_of.append(number)
    table = images / "captions.parquet"
    pq.write_table(pa.table({"image": names, "caption": captions}), table)
    gallery = folder / "gallery.safetensors"
    made = run_cli(
        "images", str(table), "--column", "image", "--keep-columns", "caption", "--model", MODEL, "-o", str(gallery)
    )
    lines = folder / "texts.txt"
    lines.write_text("".join(t + "\n" for t in TEXTS))
    texts = folder / "texts.safetensors"
    finish(run_cli("text", str(lines), "--model", MODEL, "-o", str(texts)))
    finish(made)
    keys, items = _output_keys(gallery)
    paths = [item.get("path") for item in items]
    clusters = [source_of[names.index(item["path"].rsplit("/", 1)[-1])] for item in items]
    rng = np.random.default_rng(7)
    xy = np.array([CENTRES[c] for c in clusters]) + rng.uniform(-1.5, 1.5, size=(len(keys), 2))
    layout = {
        "key": keys,
        "x": xy[:, 0].astype(np.float32),
        "y": xy[:, 1].astype(np.float32),
        "cluster": np.array(clusters, dtype=np.int32),
        "cluster_name": [CLUSTER_NAMES[c] for c in clusters],
        "path": paths,
    }
    assert tuple(layout) == MAP_COLUMNS
    _write_table(layout, map_path(gallery).path, gallery, "map")
    rows = {column: [] for column in GROUP_COLUMNS}
    for group in range(3):  # each source's copies; the first in the output kept
        members = [place for place, c in enumerate(clusters) if c == group]
        for rank, place in enumerate(members):
            rows["key"].append(keys[place])
            rows["group"].append(group)
            rows["keep"].append(rank == 0)
            rows["similarity"].append(1.0 if rank == 0 else 0.99 - 0.01 * rank)
            rows["path"].append(paths[place])
    _write_table(rows, groups_path(gallery).path, gallery, "groups")
    server = ServerProcess(
        "--model", MODEL, "--output", str(gallery), "--output", str(texts), env={"GEMMA_EMBED_API_KEY": KEY}
    )
    try:
        server.ready()
        yield {
            "server": server,
            "keys": keys,
            "items": items,
            "clusters": clusters,
            "layout": layout,
            "groups": rows,
            "texts": texts,
        }
    finally:
        server.kill()


def _unpacked(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


# ------------------------------------------------------------------------------------------ the routes


def test_the_map_route_sends_every_point_as_typed_arrays(viewed):
    status, headers, body = call(viewed["server"], "GET", "/v1/outputs/gallery/map", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert "default-src 'none'" in headers["content-security-policy"]
    answer = json.loads(body)
    layout, n = viewed["layout"], len(viewed["keys"])
    assert answer["points"] == n == 9
    assert _unpacked(answer["x"], "<f4").tolist() == layout["x"].tolist()
    assert _unpacked(answer["y"], "<f4").tolist() == layout["y"].tolist()
    assert _unpacked(answer["cluster"], "<i4").tolist() == viewed["clusters"]
    assert _unpacked(answer["place"], "<i4").tolist() == list(range(n))  # rows in output order
    assert answer["clusters"] == [{"id": c, "name": CLUSTER_NAMES[c], "size": 3} for c in range(3)]
    assert call(viewed["server"], "GET", "/v1/outputs/gallery/map")[0] == 401  # behind the key like every route


def test_the_duplicates_route_lists_groups_kept_item_first(viewed):
    status, answer = call_json(viewed["server"], "GET", "/v1/outputs/gallery/duplicates?offset=1&limit=1", headers=AUTH)
    assert status == 200
    assert (answer["groups"], answer["items"], answer["to_drop"], answer["offset"]) == (3, 9, 6, 1)
    (group,) = answer["data"]
    members = [p for p, c in enumerate(viewed["clusters"]) if c == 1]
    assert group["group"] == 1 and group["size"] == 3
    assert [item["index"] for item in group["items"]] == members  # the kept one first, then most similar first
    assert [item["keep"] for item in group["items"]] == [True, False, False]
    assert [item["similarity"] for item in group["items"]] == pytest.approx([1.0, 0.98, 0.97])
    first = group["items"][0]
    assert first["key"] == viewed["keys"][members[0]]
    assert first["thumbnail"] == f"/v1/outputs/gallery/items/{members[0]}/thumbnail"
    for query, code in [("limit=0", 400), ("limit=101", 400), ("offset=-1", 400), ("offset=x", 400)]:
        assert call(viewed["server"], "GET", f"/v1/outputs/gallery/duplicates?{query}", headers=AUTH)[0] == code


def test_records_are_items_by_place_with_their_thumbnail_routes(viewed):
    server = viewed["server"]
    status, answer = call_json(server, "GET", "/v1/outputs/gallery/records?at=3,0", headers=AUTH)
    assert status == 200
    assert [r["key"] for r in answer["data"]] == [viewed["keys"][3], viewed["keys"][0]]
    assert [r["caption"] for r in answer["data"]] == [viewed["items"][3]["caption"], viewed["items"][0]["caption"]]
    assert answer["data"][1]["thumbnail"] == "/v1/outputs/gallery/items/0/thumbnail"
    status, text = call_json(server, "GET", "/v1/outputs/texts/records?at=0", headers=AUTH)
    assert status == 200 and text["data"][0]["thumbnail"] is None  # texts have no picture
    for query, code in [("at=", 400), ("at=1,x", 400), ("at=-1", 400), ("at=9", 404), ("at=" + "1," * 501, 413)]:
        status, error = call_json(server, "GET", f"/v1/outputs/gallery/records?{query}", headers=AUTH)
        assert status == code and error["error"]["message"], query
    assert call(server, "GET", "/v1/outputs/nope/records?at=0", headers=AUTH)[0] == 404


def test_an_output_without_tables_gets_them_computed_on_first_use_and_kept(viewed):
    """The text output has neither table: the first request computes each with the library and keeps it beside the
    output, where `gemma-embed map` / `dedup` would have written it."""
    import gemma_embed.collection as library

    for route, path_of in [("map", library.map_path), ("duplicates", library.groups_path)]:
        status, answer = call_json(viewed["server"], "GET", f"/v1/outputs/texts/{route}", headers=AUTH)
        assert status == 200 and path_of(viewed["texts"]).exists(), answer
    status, answer = call_json(viewed["server"], "GET", "/v1/outputs/texts/map", headers=AUTH)
    assert status == 200 and answer["points"] == len(TEXTS) == sum(c["size"] for c in answer["clusters"])


def test_kept_table_is_the_librarys_or_its_reason_and_the_command(tmp_path, monkeypatch):
    """The one place the views reach the library: its `ensure_*` (a computed or kept table), and its failure as the
    reason beside the command to run."""
    from gemma_embed.collection import kept
    from gemma_embed.locations import location
    from gemma_embed.serve.collection_views import TableMissing, kept_table

    output = tmp_path / "photos.safetensors"
    with pytest.raises(TableMissing, match="photos.safetensors.*run `gemma-embed map .*photos.safetensors`"):
        kept_table("map", output)  # no such output: the library's own line, and the command
    computed = []
    table = tmp_path / "kept.parquet"
    monkeypatch.setattr(kept, "ensure_groups", lambda out: computed.append(out) or str(table))
    assert kept_table("groups", output) == location(table) and computed == [output]

    def without_extra(out):
        raise ImportError("gemma-embed map needs umap-learn: pip install 'gemma-embed[map]'")

    monkeypatch.setattr(kept, "ensure_map", without_extra)
    with pytest.raises(TableMissing, match="umap-learn.*or run `gemma-embed map"):
        kept_table("map", output)


class _Items:
    """A served output's face as the views read it (keys by place, no pictures): a group of thousands without one."""

    name, modality, path = "many", "text", "many.safetensors"

    def __init__(self, count: int):
        from gemma_embed.serve.collections import Item

        self.items = [Item(f"k{i}", {"path": f"/data/{i}.txt", "caption": f"text {i}"}) for i in range(count)]

    def item(self, place):
        return self.items[place] if 0 <= place < len(self.items) else None

    def place(self, key):
        return int(key[1:]) if key.startswith("k") and int(key[1:]) < len(self.items) else None

    def thumbnail_route(self, place, path):
        return None


def test_a_large_group_is_one_small_answer_kept_item_first():
    """5,000 items in one group and a pair: the page lists 24 of the large one, the kept first and then the most
    similar, and counts the rest; groups come in their numbers' order, a page at a time."""
    from gemma_embed.serve.collection_views import GROUP_ITEMS_SHOWN, _group_answer, _groups_of

    big = 5000
    similarity = np.linspace(0.9, 0.99, big)
    rows = {
        "key": [f"k{i}" for i in range(big + 2)],
        "group": [1] * big + [0, 0],
        "keep": [i == 17 for i in range(big)] + [False, True],
        "similarity": [*similarity.tolist(), 0.95, 1.0],
        "path": [f"/data/{i}.txt" for i in range(big + 2)],
    }
    every = _groups_of(_Items(big + 2), pa.table(rows))
    assert (every["count"], every["items"]) == (2, big + 2)
    pair, large = (_group_answer(_Items(big + 2), group) for group in every["groups"])
    assert (pair["group"], [i["index"] for i in pair["items"]]) == (0, [big + 1, big])  # the kept one first
    assert large["size"] == big and len(large["items"]) == GROUP_ITEMS_SHOWN == 24
    assert large["items"][0]["index"] == 17 and large["items"][0]["keep"]
    shown = [i["similarity"] for i in large["items"][1:]]
    assert shown == sorted(similarity[np.arange(big) != 17].tolist(), reverse=True)[: GROUP_ITEMS_SHOWN - 1]
    assert len(json.dumps(large)) < 10_000


def test_a_table_naming_items_the_output_lacks_is_refused_as_stale(viewed):
    """A map made from another version of the output: 409 with what to run, not points in the wrong places."""
    from gemma_embed.collection import map_path

    kept = map_path(viewed["texts"])
    stale = {**viewed["layout"], "key": ["gone-" + k for k in viewed["layout"]["key"]]}
    _write_table(stale, kept.path, viewed["texts"], "map")
    try:
        status, answer = call_json(viewed["server"], "GET", "/v1/outputs/texts/map", headers=AUTH)
        assert status == 409 and answer["error"]["code"] == "stale_table"
        assert "gemma-embed map" in answer["error"]["message"]
    finally:
        kept.rm_file(missing_ok=True)


# ------------------------------------------------------------------------------------------ in Chromium

PALETTE = ["#4363d8", "#f58231", "#3cb44b"]  # map.js's first three cluster colours
expect = None  # playwright's expect, set by the chromium fixture (playwright is imported only where it is used)


@pytest.fixture(scope="module")
def chromium():
    global expect
    with chromium_browser() as (browser, expect):
        yield browser


@pytest.fixture
def page(viewed, chromium):
    """A page of the gallery that records every request it makes (and refuses any to another origin), every dialog
    and every script error; after the test none may have left the server, and no dialog or error may be seen."""
    origin = viewed["server"].url
    context = chromium.new_context(http_credentials={"username": "gallery", "password": KEY}, viewport=VIEWPORT)
    requested, elsewhere, dialogs, problems = [], [], [], []

    def only_here(route):
        url = route.request.url
        requested.append(url)
        if url == origin or url.startswith(origin + "/"):
            route.continue_()
        else:
            elsewhere.append(url)
            route.abort()

    context.route("**/*", only_here)
    opened = context.new_page()
    opened.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    opened.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    opened.on("pageerror", lambda error: problems.append(str(error)))
    opened.requested, opened.problems = requested, problems
    yield opened
    context.close()
    assert requested and elsewhere == [], elsewhere  # every request went to this server
    assert dialogs == [] and problems == []


VIEWPORT = {"width": 1200, "height": 900}


def _open(page, viewed, view: str):
    page.goto(viewed["server"].url + "/")
    page.wait_for_selector("#output option", state="attached")
    page.click(f"#views button[data-view='{view}']")


def _places_on_screen(page, places) -> list[dict]:
    """Each place's point on the page (CSS pixels), as map.js draws it."""
    box = page.locator("#map").bounding_box()
    found = [page.evaluate("place => mapPointOnScreen(place)", place) for place in places]
    assert all(found), found
    return [{**p, "page_x": box["x"] + p["x"], "page_y": box["y"] + p["y"]} for p in found]


def _pixel(page, x: float, y: float) -> str:
    return page.evaluate(
        """([x, y]) => {
            const r = window.devicePixelRatio || 1;
            const context = document.getElementById('map').getContext('2d');
            const d = context.getImageData(Math.floor(x * r), Math.floor(y * r), 1, 1).data;
            return '#' + [d[0], d[1], d[2]].map(v => v.toString(16).padStart(2, '0')).join('');
        }""",
        [x, y],
    )


@pytest.mark.browser
def test_the_map_draws_every_point_in_its_clusters_colour(viewed, page):
    _open(page, viewed, "map")
    canvas = page.locator("#map")
    n = len(viewed["keys"])
    expect(canvas).to_have_attribute("data-drawn", str(n))  # every point drawn, reported by the page itself
    assert canvas.get_attribute("data-points") == str(n)
    for place, point in enumerate(_places_on_screen(page, range(n))):
        assert _pixel(page, point["x"], point["y"]) == PALETTE[viewed["clusters"][place]], place
    assert _pixel(page, 3, 3) == "#ffffff"  # and nothing where no point is
    legend = page.locator("#legend-list .name").all_text_contents()
    assert legend == CLUSTER_NAMES  # the markup in a cluster's name shown as text
    assert page.locator("#legend-list b").count() == 0
    expect(page.locator("#status")).to_have_text("9 points, 3 clusters")


@pytest.mark.browser
def test_zooming_in_draws_what_is_in_view_and_a_double_click_fits_every_point_again(viewed, page):
    _open(page, viewed, "map")
    canvas = page.locator("#map")
    n = len(viewed["keys"])
    expect(canvas).to_have_attribute("data-drawn", str(n))
    (point,) = _places_on_screen(page, [viewed["clusters"].index(2)])
    page.mouse.move(point["page_x"], point["page_y"])
    frames = int(canvas.get_attribute("data-frames"))
    page.mouse.wheel(0, -1500)  # zoom in on that point: the other clusters leave the canvas
    expect(canvas).to_have_attribute("data-drawn", re.compile(r"^[1-8]$"))  # some points, not all, not none
    assert int(canvas.get_attribute("data-frames")) > frames
    (after,) = _places_on_screen(page, [viewed["clusters"].index(2)])
    assert _pixel(page, after["x"], after["y"]) == PALETTE[2]
    # the zoom is about the cursor: the point stays under it (within the rounding of the mouse event's whole
    # pixels, times the zoom)
    assert abs(after["x"] - point["x"]) < 12 and abs(after["y"] - point["y"]) < 12
    canvas.dblclick(position={"x": 3, "y": 3})
    expect(canvas).to_have_attribute("data-drawn", str(n))


@pytest.mark.browser
def test_hovering_a_point_loads_its_thumbnail_and_shows_names_as_text(viewed, page):
    _open(page, viewed, "map")
    expect(page.locator("#map")).to_have_attribute("data-drawn", str(len(viewed["keys"])))
    hostile = next(p for p, item in enumerate(viewed["items"]) if item["caption"] == HOSTILE_CAPTION)
    marked = next(p for p, item in enumerate(viewed["items"]) if item["path"].endswith(MARKUP_NAME))
    for place in (hostile, marked):
        (point,) = _places_on_screen(page, [place])
        page.mouse.move(point["page_x"], point["page_y"])
        tip = page.locator("#map-tip")
        expect(tip).to_be_visible()
        expect(tip).to_have_attribute("data-place", str(place))
        # The item's own thumbnail, asked of this server (the grid shown on arrival may have asked first: then the
        # browser's cache answers the hover, so the request is looked for in the whole page's log), and decoded.
        thumbnail = f"/items/{place}/thumbnail"
        expect(page.locator("#map-tip-img")).to_have_attribute("src", re.compile(re.escape(thumbnail) + "$"))
        assert page.locator("#map-tip-img").evaluate("i => i.decode().then(() => i.naturalWidth)") > 0
        assert any(url.endswith(thumbnail) for url in page.requested)
        expect(page.locator("#map-tip-caption")).to_have_text(viewed["items"][place]["caption"])
        expect(page.locator("#map-tip-key")).to_contain_text(viewed["keys"][place])
        expect(page.locator("#map-tip-file")).to_have_text(viewed["items"][place]["path"].rsplit("/", 1)[-1])
    assert page.locator("#map-tip-file").text_content() == MARKUP_NAME  # the last one hovered: its name as text
    assert page.locator("img[src='x']").count() == 0  # neither the caption's nor the file name's <img> is an element
    page.mouse.move(2, 2)  # off every point: the tip goes
    expect(page.locator("#map-tip")).to_be_hidden()


@pytest.mark.browser
def test_clicking_a_cluster_or_its_legend_entry_or_a_lasso_lists_its_items(viewed, page):
    _open(page, viewed, "map")
    expect(page.locator("#map")).to_have_attribute("data-drawn", str(len(viewed["keys"])))

    def members(cluster: int) -> list[str]:
        return [viewed["keys"][p] for p, c in enumerate(viewed["clusters"]) if c == cluster]

    listed = page.locator("#grid figure .key")
    (point,) = _places_on_screen(page, [viewed["clusters"].index(1)])
    page.mouse.click(point["page_x"], point["page_y"])
    expect(listed).to_have_text(members(1))
    expect(page.locator("#map")).to_have_attribute("data-selected", "1")
    page.locator("#legend-list button[data-cluster='2']").click()
    expect(listed).to_have_text(members(2))
    expect(page.locator("#status")).to_have_text("squares: 3 items, 3 shown")
    inside = _places_on_screen(page, [p for p, c in enumerate(viewed["clusters"]) if c == 0])
    left, right = min(p["page_x"] for p in inside) - 15, max(p["page_x"] for p in inside) + 15
    top, bottom = min(p["page_y"] for p in inside) - 15, max(p["page_y"] for p in inside) + 15
    page.keyboard.down("Shift")
    page.mouse.move(left, top)
    page.mouse.down()
    for x, y in [(right, top), (right, bottom), (left, bottom)]:
        page.mouse.move(x, y, steps=4)
    page.mouse.up()
    page.keyboard.up("Shift")
    expect(listed).to_have_text(members(0))
    expect(page.locator("#map")).to_have_attribute("data-selected", "lasso")


@pytest.mark.browser
def test_the_duplicates_view_shows_each_group_with_its_kept_item_marked(viewed, page):
    _open(page, viewed, "duplicates")
    groups = page.locator("#groups .group")
    expect(groups).to_have_count(3)
    expect(page.locator("#status")).to_have_text("3 groups of near-duplicates, 9 items, 6 to drop")
    rows = viewed["groups"]
    for number in range(3):
        group = groups.nth(number)
        keys = [k for k, g in zip(rows["key"], rows["group"], strict=True) if g == number]
        kept = [k for k, g, keep in zip(rows["key"], rows["group"], rows["keep"], strict=True) if g == number and keep]
        expect(group.locator("figure .key")).to_have_text(keys)  # side by side, the kept one first
        expect(group.locator("figure.kept")).to_have_count(1)
        expect(group.locator("figure.kept .key")).to_have_text(kept)
        expect(group.locator("figure.kept .mark")).to_have_text("kept")
        expect(group.locator("figure:not(.kept) .mark")).to_have_text(["similarity 0.9800", "similarity 0.9700"])
    widths = page.locator("#groups img").evaluate_all(
        "images => Promise.all(images.map(i => i.decode())).then(() => images.map(i => i.naturalWidth))"
    )
    assert len(widths) == 9 and all(0 < w <= 224 for w in widths)
    assert HOSTILE_CAPTION in page.locator("#groups .caption").all_text_contents()
    assert MARKUP_NAME in page.locator("#groups .file").all_text_contents()  # a file name holding markup, as text
    assert page.locator("img[src='x']").count() == 0
    assert sum(url.endswith("/thumbnail") for url in page.requested) >= 9


@pytest.mark.browser
def test_a_view_whose_table_is_not_there_yet_is_computed_and_drawn(viewed, page):
    _open(page, viewed, "map")
    page.select_option("#output", "texts")
    expect(page.locator("#map")).to_have_attribute("data-drawn", str(len(TEXTS)), timeout=120_000)
