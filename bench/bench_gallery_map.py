"""The gallery's Map view at collection scale: 100k points in Chromium (issue 49).

    python -m bench.bench_gallery_map [--rows 100000] [--folder /tmp/gemma-embed-bench-map] [--screenshots DIR]

An image output of ROWS items is written with the tool's writer (random unit vectors; the header, and the three
sample images the items point to, of a real `gemma-embed images` run on the tiny EmbeddingGemma 2), with a map
table of 12 Gaussian blobs (the contract's columns, gemma_embed.collection) and a groups table of ROWS/20 pairs.
`gemma-embed serve` serves it on 127.0.0.1; the system Chromium (Playwright) opens the gallery's Map view.

Measured, in the page: the time from the Map button to every point drawn (the request, base64 decode, grid index,
first frame); a full redraw of every point (ImageData fill, putImageData, labels) as map.js's `draw()` runs it on a
pan, 40 times at shifted views; a pan driven by the mouse (40 moves), its frames' own times (map.js reports each
in `data-frame-ms`); the hover lookup (`pick`, through the grid index) at 2,000 random places; and the Duplicates
view's first page. Timings on a shared machine move with the other work on it: medians and the 95th percentile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import ROOT
from bench.common import cpu_name

MODEL = ROOT / "samples" / "tiny-embeddinggemma2"
SAMPLES = ["landscape.jpg", "portrait.png", "square.webp"]
BLOBS = 12
# the installed command, importing this checkout (PYTHONPATH): what a user runs
EXE = shutil.which("gemma-embed") or str(Path(sys.executable).parent / "gemma-embed")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def build(folder: Path, rows: int) -> Path:
    """The output, its map and its groups; reused when present."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from gemma_embed.collection import groups_path, map_path
    from gemma_embed.store import EmbeddingWriter, output_files
    from gemma_embed.store.tensors_file import read_header

    output = folder / "collection.safetensors"
    if output_files(output) and map_path(output).exists():
        return output
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    for name in SAMPLES:
        shutil.copy(ROOT / "samples" / "media" / "images" / name, images / name)
    small = folder / "small.safetensors"
    if not output_files(small):
        subprocess.run(
            [EXE, "images", str(images), "--model", str(MODEL), "-o", str(small), "-q"], check=True, cwd=ROOT, env=ENV
        )
    made = read_header(small)
    header = {k: v for k, v in made.items() if k not in ("keys", "items", "dtype", "format", "created_by")}
    writer = EmbeddingWriter(output, header, output_dtype="float16", shard_size=rows, flush_seconds=float("inf"))
    generator = torch.Generator().manual_seed(0)
    dim = int(header["dim"])
    for start in range(0, rows, 10_000):
        block = torch.nn.functional.normalize(torch.randn(min(10_000, rows - start), dim, generator=generator), dim=1)
        for offset, row in enumerate(block):
            i = start + offset
            meta = {"path": str(images / SAMPLES[i % 3]), "caption": f"item {i}"}
            writer.add(f"item-{i:07d}", row[None], meta, i)
    writer.close()
    rng = np.random.default_rng(0)
    blob = rng.integers(0, BLOBS, rows)
    centres = rng.uniform(-50, 50, size=(BLOBS, 2))
    xy = centres[blob] + rng.normal(0, 4, size=(rows, 2))
    keys = [f"item-{i:07d}" for i in range(rows)]
    paths = [str(images / SAMPLES[i % 3]) for i in range(rows)]
    pq.write_table(
        pa.table(
            {
                "key": keys,
                "x": xy[:, 0].astype(np.float32),
                "y": xy[:, 1].astype(np.float32),
                "cluster": blob.astype(np.int32),
                "cluster_name": [f"blob {b}: item-{b:07d}" for b in blob],
                "path": paths,
            }
        ),
        map_path(output).path,
    )
    pairs = rows // 20
    members = np.arange(2 * pairs)
    pq.write_table(
        pa.table(
            {
                "key": [keys[i] for i in members],
                "group": (members // 2).astype(np.int64),
                "keep": members % 2 == 0,
                "similarity": np.where(members % 2 == 0, 1.0, 0.97),
                "path": [paths[i] for i in members],
            }
        ),
        groups_path(output).path,
    )
    return output


def serve(output: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [EXE, "serve", "--port", "0", "--output", str(output), "-q"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=ENV,
    )
    for line in proc.stdout:
        event = json.loads(line)
        if event["type"] == "listening":
            return proc, event["url"]
    raise SystemExit("the server ended before it listened")


def spread(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]}


def measure(url: str, rows: int, screenshots: Path | None) -> dict:
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/")
        page.wait_for_selector("#output option", state="attached")
        started = time.perf_counter()
        page.click("#views button[data-view='map']")
        page.wait_for_selector(f"#map[data-drawn='{rows}']", timeout=120_000)
        first_drawn_s = time.perf_counter() - started
        redraw_ms = page.evaluate(
            """() => {
                const times = [];
                for (let k = 0; k < 40; k++) {
                    map.view.cx += 0.5 * (k % 2 ? 1 : -1);
                    map.dirty = true;
                    const t = performance.now();
                    draw();
                    times.push(performance.now() - t);
                }
                return times;
            }"""
        )
        box = page.locator("#map").bounding_box()
        cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        frames_before = int(page.locator("#map").get_attribute("data-frames"))
        pan_frames = []
        page.mouse.move(cx, cy)
        page.mouse.down()
        for k in range(40):
            page.mouse.move(cx + 3 * (k + 1), cy + 2 * (k + 1))
            page.wait_for_function("n => Number(document.getElementById('map').dataset.frames) > n", arg=frames_before)
            frames_before = int(page.locator("#map").get_attribute("data-frames"))
            pan_frames.append(float(page.locator("#map").get_attribute("data-frame-ms")))
        page.mouse.up()
        pick_us = page.evaluate(
            """() => {
                const c = document.getElementById('map');
                const w = c.width, h = c.height;
                let found = 0;
                const t = performance.now();
                for (let k = 0; k < 2000; k++) {
                    if (pick(Math.random() * w, Math.random() * h) >= 0) found++;
                }
                return [(performance.now() - t) * 1000 / 2000, found];
            }"""
        )
        map_bytes = page.evaluate(
            "url => fetch(url).then(r => r.text()).then(t => t.length)", url + "/v1/outputs/collection/map"
        )
        if screenshots is not None:
            page.evaluate("() => { fit(); requestDraw(true); }")
            page.wait_for_timeout(200)  # a frame for the fitted view (only for the picture)
            page.screenshot(path=str(screenshots / f"map-{rows}.png"))
        started = time.perf_counter()
        page.click("#views button[data-view='duplicates']")
        page.wait_for_selector("#groups .group >> nth=29")
        duplicates_s = time.perf_counter() - started
        browser.close()
    return {
        "first_drawn_s": first_drawn_s,
        "redraw_ms": spread(redraw_ms),
        "pan_frame_ms": spread(pan_frames),
        "pick_us": pick_us[0],
        "picks_on_a_point": pick_us[1],
        "map_json_bytes": map_bytes,
        "duplicates_first_page_s": duplicates_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/gemma-embed-bench-map"))
    parser.add_argument("--screenshots", type=Path, default=None)
    args = parser.parse_args()
    output = build(args.folder / f"rows-{args.rows}", args.rows)
    proc, url = serve(output)
    try:
        result = measure(url, args.rows, args.screenshots)
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs (shared with other agents); {args.rows} points, Chromium")
    print(json.dumps({"rows": args.rows, **result}))


if __name__ == "__main__":
    main()
