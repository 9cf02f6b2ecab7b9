// The Map view: every item of the output as a point of its 2D layout (`gemma-embed map`), coloured by cluster, on
// one canvas. Points are written straight into an ImageData (one pass over typed arrays, no path per point), so a
// redraw of 100k points costs a few milliseconds; the hovered point is found through a grid index over the layout
// (the cells under the cursor, not a scan of every point). Loaded after gallery.js and views.js.
"use strict";

// Sasha Trubetskoy's distinct colours, less the pale and grey ones (a pale point vanishes on white; grey is for
// points in no cluster): a cluster's colour is its number's place in the list.
const PALETTE = [
  "#4363d8", "#f58231", "#3cb44b", "#e6194b", "#911eb4", "#42d4f4", "#f032e6", "#bfef45",
  "#469990", "#9a6324", "#800000", "#808000", "#000075", "#fabed4", "#dcbeff", "#ffe119",
];
const NOISE = "#c9c9c9";
const BACKGROUND = "#ffffff";
const CELLS = 256; // the grid index: CELLS x CELLS cells over the layout's bounds
const PICK_PX = 6; // how near (CSS pixels) the cursor must be to a point to hover it
const DOT_PX = 3; // a point's side, CSS pixels
const PAD_PX = 28; // margin around the layout when it is fitted to the canvas (room for the top labels)

const map = {
  output: null,
  n: 0,
  x: null,
  y: null,
  cluster: null,
  place: null,
  clusters: [],
  bounds: null,
  grid: null, // {starts: Uint32Array(CELLS*CELLS+1), order: Uint32Array(n)}
  view: { cx: 0, cy: 0, scale: 1 }, // layout point at the canvas centre, device pixels per layout unit
  selected: null, // a cluster number, or null
  marked: null, // Uint8Array: the lasso's points, or null
  hover: -1,
  lasso: null, // screen points (device pixels) while the lasso is drawn
  image: null,
  dirty: true, // the points must be drawn again (not only the overlay)
  pending: false,
  recordCache: new Map(),
};

function hexColour(hex) {
  const value = parseInt(hex.slice(1), 16);
  return [(value >> 16) & 255, (value >> 8) & 255, value & 255];
}

function clusterColour(number) {
  return number < 0 ? NOISE : PALETTE[number % PALETTE.length];
}

// ImageData's pixels as one little-endian uint32 (ABGR), faded toward white when `faded`.
function packed(hex, faded) {
  let [r, g, b] = hexColour(hex);
  if (faded) {
    [r, g, b] = [r, g, b].map((v) => Math.round(v + (255 - v) * 0.8));
  }
  return (255 << 24) | (b << 16) | (g << 8) | r;
}

function buildGrid() {
  const { n, x, y } = map;
  let [minX, minY, maxX, maxY] = [Infinity, Infinity, -Infinity, -Infinity];
  for (let i = 0; i < n; i++) {
    if (x[i] < minX) minX = x[i];
    if (x[i] > maxX) maxX = x[i];
    if (y[i] < minY) minY = y[i];
    if (y[i] > maxY) maxY = y[i];
  }
  if (!n) {
    [minX, minY, maxX, maxY] = [0, 0, 1, 1];
  }
  const width = maxX - minX || 1;
  const height = maxY - minY || 1;
  map.bounds = { minX, minY, maxX, maxY, width, height };
  const cells = new Uint32Array(n);
  const counts = new Uint32Array(CELLS * CELLS + 1);
  for (let i = 0; i < n; i++) {
    const c = cellOf(x[i], y[i]);
    cells[i] = c;
    counts[c + 1]++;
  }
  for (let c = 0; c < CELLS * CELLS; c++) {
    counts[c + 1] += counts[c];
  }
  const starts = counts.slice();
  const order = new Uint32Array(n);
  const fill = counts.slice(0, CELLS * CELLS);
  for (let i = 0; i < n; i++) {
    order[fill[cells[i]]++] = i;
  }
  map.grid = { starts, order };
}

function cellColumn(value, min, size) {
  return Math.min(CELLS - 1, Math.max(0, Math.floor(((value - min) / size) * CELLS)));
}

function cellOf(px, py) {
  const b = map.bounds;
  return cellColumn(py, b.minY, b.height) * CELLS + cellColumn(px, b.minX, b.width);
}

// Every point whose cell meets the layout rectangle [x0, x1] x [y0, y1].
function eachInBox(x0, y0, x1, y1, visit) {
  const b = map.bounds;
  const c0 = cellColumn(x0, b.minX, b.width);
  const c1 = cellColumn(x1, b.minX, b.width);
  const r0 = cellColumn(y0, b.minY, b.height);
  const r1 = cellColumn(y1, b.minY, b.height);
  const { starts, order } = map.grid;
  for (let r = r0; r <= r1; r++) {
    for (let c = c0; c <= c1; c++) {
      const cell = r * CELLS + c;
      for (let k = starts[cell]; k < starts[cell + 1]; k++) {
        visit(order[k]);
      }
    }
  }
}

function canvasSize() {
  const canvas = $("map");
  const ratio = window.devicePixelRatio || 1;
  return { ratio, width: Math.max(1, Math.round(canvas.clientWidth * ratio)), height: Math.max(1, Math.round(canvas.clientHeight * ratio)) };
}

function fit() {
  const { ratio, width, height } = canvasSize();
  const b = map.bounds;
  const pad = PAD_PX * ratio;
  map.view.scale = Math.min((width - 2 * pad) / b.width, (height - 2 * pad) / b.height);
  map.view.cx = b.minX + b.width / 2;
  map.view.cy = b.minY + b.height / 2;
}

// Device pixels of a layout point (y grows upward on the map, downward on the canvas).
function toScreen(px, py, width, height) {
  const v = map.view;
  return [(px - v.cx) * v.scale + width / 2, height / 2 - (py - v.cy) * v.scale];
}

function toLayout(sx, sy, width, height) {
  const v = map.view;
  return [(sx - width / 2) / v.scale + v.cx, v.cy - (sy - height / 2) / v.scale];
}

// Where the point of an item (its place in the output) is, in CSS pixels from the canvas's top left; null when it
// has no point or the point is off the canvas. (What a user or a test hovers.)
function mapPointOnScreen(place) {
  const i = map.place ? map.place.indexOf(place) : -1;
  if (i < 0) {
    return null;
  }
  const { ratio, width, height } = canvasSize();
  const [sx, sy] = toScreen(map.x[i], map.y[i], width, height);
  if (sx < 0 || sy < 0 || sx >= width || sy >= height) {
    return null;
  }
  return { x: sx / ratio, y: sy / ratio, colour: clusterColour(map.cluster[i]) };
}

function requestDraw(points) {
  map.dirty = map.dirty || points;
  if (!map.pending) {
    map.pending = true;
    requestAnimationFrame(draw);
  }
}

function drawPoints(context, width, height, ratio) {
  if (!map.image || map.image.width !== width || map.image.height !== height) {
    map.image = context.createImageData(width, height);
  }
  const pixels = new Uint32Array(map.image.data.buffer);
  pixels.fill(packed(BACKGROUND, false));
  const { n, x, y, cluster, view, selected, marked } = map;
  const focus = selected !== null || marked !== null;
  // colours by cluster number + 1 (-1, no cluster, at 0): an array read per point, not a Map lookup
  const top = map.clusters.reduce((most, c) => Math.max(most, c.id), -1);
  const bright = new Uint32Array(top + 2);
  const faded = new Uint32Array(top + 2);
  for (const c of map.clusters) {
    bright[c.id + 1] = packed(clusterColour(c.id), false);
    faded[c.id + 1] = packed(clusterColour(c.id), true);
  }
  const dot = Math.max(1, Math.round(DOT_PX * ratio));
  const ox = width / 2 - view.cx * view.scale - (dot >> 1);
  const oy = height / 2 + view.cy * view.scale - (dot >> 1);
  const scale = view.scale;
  let drawn = 0;
  // two passes when something is selected: the rest faded first, the selection over it
  for (let pass = focus ? 0 : 1; pass < 2; pass++) {
    for (let i = 0; i < n; i++) {
      const chosen = !focus || (marked !== null ? marked[i] === 1 : cluster[i] === selected);
      if (chosen !== (pass === 1)) {
        continue;
      }
      const sx = Math.round(x[i] * scale + ox);
      const sy = Math.round(oy - y[i] * scale);
      if (sx + dot <= 0 || sy + dot <= 0 || sx >= width || sy >= height) {
        continue;
      }
      drawn++;
      const colour = chosen ? bright[cluster[i] + 1] : faded[cluster[i] + 1];
      if (sx >= 0 && sy >= 0 && sx + dot <= width && sy + dot <= height) {
        for (let row = 0, at = sy * width + sx; row < dot; row++, at += width) {
          for (let k = 0; k < dot; k++) {
            pixels[at + k] = colour;
          }
        }
      } else {
        // on the canvas's edge: only the pixels inside it
        for (let row = Math.max(0, sy); row < Math.min(height, sy + dot); row++) {
          for (let column = Math.max(0, sx); column < Math.min(width, sx + dot); column++) {
            pixels[row * width + column] = colour;
          }
        }
      }
    }
  }
  return drawn;
}

// Cluster names over the map, the largest clusters' first; a name that would overlap one already drawn is left out
// (the legend has every name).
function drawLabels(context, width, height, ratio) {
  context.font = Math.round(12 * ratio) + "px system-ui, sans-serif";
  context.textAlign = "center";
  context.textBaseline = "middle";
  context.lineWidth = 3 * ratio;
  context.strokeStyle = "rgba(255,255,255,0.9)";
  context.fillStyle = "#222";
  const taken = [];
  const lineHeight = 14 * ratio;
  for (const c of [...map.clusters].sort((a, b) => b.size - a.size)) {
    if (c.id < 0 || !c.name) {
      continue;
    }
    const [sx, top] = toScreen(c.cx, c.top, width, height);
    const sy = top - 12 * ratio;
    if (sx < 0 || sy < 0 || sx > width || sy > height) {
      continue;
    }
    const label = c.name.length > 40 ? c.name.slice(0, 39) + "…" : c.name; // drawn as pixels, never parsed
    const half = context.measureText(label).width / 2 + 4 * ratio;
    const box = [sx - half, sy - lineHeight / 2, sx + half, sy + lineHeight / 2];
    if (taken.some((t) => box[0] < t[2] && t[0] < box[2] && box[1] < t[3] && t[1] < box[3])) {
      continue;
    }
    taken.push(box);
    context.strokeText(label, sx, sy);
    context.fillText(label, sx, sy);
  }
}

function draw() {
  map.pending = false;
  const canvas = $("map");
  if (!map.x || $("map-view").hidden) {
    return;
  }
  const started = performance.now();
  const { ratio, width, height } = canvasSize();
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
    map.dirty = true;
  }
  const context = canvas.getContext("2d");
  if (map.dirty) {
    canvas.dataset.drawn = String(drawPoints(context, width, height, ratio));
    map.dirty = false;
  }
  context.putImageData(map.image, 0, 0);
  drawLabels(context, width, height, ratio);
  if (map.hover >= 0) {
    const [sx, sy] = toScreen(map.x[map.hover], map.y[map.hover], width, height);
    context.beginPath();
    context.arc(sx, sy, 5 * ratio, 0, 2 * Math.PI);
    context.lineWidth = 2 * ratio;
    context.strokeStyle = "#111";
    context.stroke();
  }
  if (map.lasso && map.lasso.length > 1) {
    context.beginPath();
    context.moveTo(map.lasso[0][0], map.lasso[0][1]);
    for (const [lx, ly] of map.lasso) {
      context.lineTo(lx, ly);
    }
    context.closePath();
    context.lineWidth = 1.5 * ratio;
    context.strokeStyle = "#3b6fd4";
    context.fillStyle = "rgba(59,111,212,0.08)";
    context.fill();
    context.stroke();
  }
  canvas.dataset.frameMs = (performance.now() - started).toFixed(2);
  canvas.dataset.frames = String(Number(canvas.dataset.frames || 0) + 1);
}

// ------------------------------------------------------------------------------------------ loading

async function loadMap(output) {
  const canvas = $("map");
  delete canvas.dataset.points;
  delete canvas.dataset.drawn;
  $("legend-list").replaceChildren();
  map.x = null;
  map.output = output;
  // the server computes a missing map first (gemma-embed map): at collection scale, minutes
  say("Loading the map of " + output + " (made now if it has none yet)...", false);
  const body = await answer(await fetch(outputPath(output) + "/map"));
  if (map.output !== output) {
    return; // another collection was chosen meanwhile
  }
  map.n = body.points;
  map.x = unpack(body.x, Float32Array);
  map.y = unpack(body.y, Float32Array);
  map.cluster = unpack(body.cluster, Int32Array);
  map.place = unpack(body.place, Int32Array);
  map.clusters = body.clusters;
  map.selected = null;
  map.marked = null;
  map.hover = -1;
  map.recordCache.clear();
  centres();
  buildGrid();
  fit();
  legend();
  canvas.dataset.points = String(map.n);
  requestDraw(true);
  say(map.n + " points, " + body.clusters.filter((c) => c.id >= 0).length + " clusters", false);
}

// Each cluster's label goes above its points, over the mean of their x (not on them: it would hide some).
function centres() {
  const sums = new Map(map.clusters.map((c) => [c.id, [0, 0, -Infinity]]));
  for (let i = 0; i < map.n; i++) {
    const s = sums.get(map.cluster[i]);
    s[0] += map.x[i];
    s[1]++;
    s[2] = Math.max(s[2], map.y[i]);
  }
  for (const c of map.clusters) {
    const [sx, count, top] = sums.get(c.id);
    c.cx = sx / Math.max(1, count);
    c.top = top;
  }
}

function legend() {
  const items = map.clusters.map((c) => {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.cluster = String(c.id);
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.backgroundColor = clusterColour(c.id); // CSSOM, not a style attribute: allowed by the policy
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = c.id < 0 ? "(no cluster)" : c.name || "cluster " + c.id;
    const size = document.createElement("span");
    size.className = "size";
    size.textContent = String(c.size);
    button.append(swatch, name, size);
    button.addEventListener("click", () => selectCluster(c.id));
    li.appendChild(button);
    return li;
  });
  $("legend-list").replaceChildren(...items);
}

// ------------------------------------------------------------------------------------------ choosing

function clusterName(number) {
  const found = map.clusters.find((c) => c.id === number);
  return number < 0 ? "no cluster" : (found && found.name) || "cluster " + number;
}

function showSelection(places, title) {
  listItems(map.output, places, title).catch((e) => say(e.message, true));
}

function selectCluster(number) {
  map.selected = number;
  map.marked = null;
  for (const button of document.querySelectorAll("#legend-list button")) {
    button.setAttribute("aria-pressed", button.dataset.cluster === String(number) ? "true" : "false");
  }
  $("map").dataset.selected = String(number);
  const places = [];
  for (let i = 0; i < map.n; i++) {
    if (map.cluster[i] === number) {
      places.push(map.place[i]);
    }
  }
  requestDraw(true);
  showSelection(places, clusterName(number));
}

function insidePolygon(px, py, polygon) {
  let inside = false;
  for (let i = 0, j = polygon.length - 1; i < polygon.length; j = i++) {
    const [xi, yi] = polygon[i];
    const [xj, yj] = polygon[j];
    if (yi > py !== yj > py && px < ((xj - xi) * (py - yi)) / (yj - yi) + xi) {
      inside = !inside;
    }
  }
  return inside;
}

function finishLasso() {
  const polygon = map.lasso;
  map.lasso = null;
  if (!polygon || polygon.length < 3) {
    requestDraw(false);
    return;
  }
  const { width, height } = canvasSize();
  const corners = polygon.map(([sx, sy]) => toLayout(sx, sy, width, height));
  const xs = corners.map((c) => c[0]);
  const ys = corners.map((c) => c[1]);
  const marked = new Uint8Array(map.n);
  const places = [];
  eachInBox(Math.min(...xs), Math.min(...ys), Math.max(...xs), Math.max(...ys), (i) => {
    const [sx, sy] = toScreen(map.x[i], map.y[i], width, height);
    if (insidePolygon(sx, sy, polygon)) {
      marked[i] = 1;
      places.push(map.place[i]);
    }
  });
  places.sort((a, b) => a - b);
  map.selected = null;
  map.marked = marked;
  $("map").dataset.selected = "lasso";
  requestDraw(true);
  showSelection(places, "lasso");
}

// The point nearest the cursor within PICK_PX, through the grid index; -1 when none.
function pick(sx, sy) {
  const { ratio, width, height } = canvasSize();
  const [lx, ly] = toLayout(sx, sy, width, height);
  const reach = (PICK_PX * ratio) / map.view.scale;
  let best = -1;
  let bestDistance = reach * reach;
  eachInBox(lx - reach, ly - reach, lx + reach, ly + reach, (i) => {
    const d = (map.x[i] - lx) ** 2 + (map.y[i] - ly) ** 2;
    if (d <= bestDistance) {
      best = i;
      bestDistance = d;
    }
  });
  return best;
}

function record(place) {
  if (!map.recordCache.has(place)) {
    map.recordCache.set(
      place,
      records(map.output, [place]).then((found) => found[0]),
    );
  }
  return map.recordCache.get(place);
}

async function showTip(i, cssX, cssY) {
  const tip = $("map-tip");
  const place = map.place[i];
  tip.dataset.place = String(place);
  const frame = $("map-frame");
  tip.hidden = false;
  tip.style.left = Math.min(cssX + 14, frame.clientWidth - 240) + "px";
  tip.style.top = Math.min(cssY + 14, frame.clientHeight - 260) + "px";
  $("map-tip-caption").textContent = "";
  $("map-tip-file").textContent = "";
  $("map-tip-key").textContent = "";
  const img = $("map-tip-img");
  img.hidden = true;
  img.removeAttribute("src");
  const found = await record(place);
  if (tip.dataset.place !== String(place) || tip.hidden) {
    return; // the cursor moved on
  }
  $("map-tip-caption").textContent = found.caption || "";
  $("map-tip-file").textContent = fileName(found.path);
  $("map-tip-key").textContent = found.key + " · " + clusterName(map.cluster[i]);
  if (found.thumbnail) {
    img.alt = found.caption || found.key;
    img.src = found.thumbnail;
    img.hidden = false;
  }
}

function hideTip() {
  const tip = $("map-tip");
  tip.hidden = true;
  delete tip.dataset.place;
}

// ------------------------------------------------------------------------------------------ the pointer

function pointerPosition(event) {
  const rect = $("map").getBoundingClientRect();
  const ratio = window.devicePixelRatio || 1;
  const cssX = event.clientX - rect.left;
  const cssY = event.clientY - rect.top;
  return { cssX, cssY, sx: cssX * ratio, sy: cssY * ratio };
}

function wireMap() {
  const canvas = $("map");
  let drag = null;
  canvas.addEventListener("pointerdown", (event) => {
    if (!map.x) {
      return;
    }
    canvas.setPointerCapture(event.pointerId);
    const at = pointerPosition(event);
    if (event.shiftKey) {
      map.lasso = [[at.sx, at.sy]];
      drag = { lasso: true };
    } else {
      drag = { sx: at.sx, sy: at.sy, cx: map.view.cx, cy: map.view.cy, moved: 0 };
    }
    hideTip();
  });
  canvas.addEventListener("pointermove", (event) => {
    if (!map.x) {
      return;
    }
    const at = pointerPosition(event);
    if (drag && drag.lasso) {
      map.lasso.push([at.sx, at.sy]);
      requestDraw(false);
    } else if (drag) {
      drag.moved = Math.max(drag.moved, Math.hypot(at.sx - drag.sx, at.sy - drag.sy));
      map.view.cx = drag.cx - (at.sx - drag.sx) / map.view.scale;
      map.view.cy = drag.cy + (at.sy - drag.sy) / map.view.scale;
      requestDraw(true);
    } else {
      const found = pick(at.sx, at.sy);
      if (found !== map.hover) {
        map.hover = found;
        requestDraw(false);
        if (found >= 0) {
          showTip(found, at.cssX, at.cssY).catch((e) => say(e.message, true));
        } else {
          hideTip();
        }
      }
    }
  });
  canvas.addEventListener("pointerup", (event) => {
    const was = drag;
    drag = null;
    if (!was) {
      return;
    }
    if (was.lasso) {
      finishLasso();
      return;
    }
    if (was.moved < 4) {
      // a click, not a pan: the cluster of the point under it (or, outside any cluster, that point alone)
      const at = pointerPosition(event);
      const found = pick(at.sx, at.sy);
      if (found >= 0 && map.cluster[found] >= 0) {
        selectCluster(map.cluster[found]);
      } else if (found >= 0) {
        map.selected = null;
        map.marked = null;
        showSelection([map.place[found]], "one point");
      }
    }
  });
  canvas.addEventListener("pointerleave", () => {
    map.hover = -1;
    hideTip();
    requestDraw(false);
  });
  canvas.addEventListener(
    "wheel",
    (event) => {
      if (!map.x) {
        return;
      }
      event.preventDefault();
      const at = pointerPosition(event);
      const { width, height } = canvasSize();
      const [lx, ly] = toLayout(at.sx, at.sy, width, height);
      map.view.scale *= Math.exp(-event.deltaY * 0.0015);
      // the layout point under the cursor stays under it
      map.view.cx = lx - (at.sx - width / 2) / map.view.scale;
      map.view.cy = ly + (at.sy - height / 2) / map.view.scale;
      requestDraw(true);
    },
    { passive: false },
  );
  canvas.addEventListener("dblclick", () => {
    fit();
    requestDraw(true);
  });
  new ResizeObserver(() => requestDraw(true)).observe(canvas);
}

views.onShow((view, output) => {
  hideTip();
  if (view !== "map") {
    return;
  }
  if (output && (output !== map.output || !map.x)) {
    loadMap(output).catch((e) => say(e.message, true));
  } else if (map.x) {
    requestDraw(true);
  }
});

document.addEventListener("DOMContentLoaded", wireMap);
