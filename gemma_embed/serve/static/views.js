// The gallery's views (Search, Map, Duplicates): switching between them, the items listed in the grid by place,
// and the Duplicates view. Loaded after gallery.js, whose `$`, `say`, `answer` and `card` it uses; map.js draws the
// Map. Every string from a collection reaches the page through textContent or a URL the server built: never HTML.
"use strict";

const GRID_PAGE = 120; // items one listing shows at a time (each a thumbnail request)

const views = {
  current: "search",
  listeners: [],
  // map.js and this file are told when their view is shown or the collection changes
  onShow(listener) {
    views.listeners.push(listener);
  },
  show(view) {
    views.current = view;
    document.body.dataset.view = view;
    for (const button of document.querySelectorAll("#views button")) {
      button.setAttribute("aria-pressed", button.dataset.view === view ? "true" : "false");
    }
    $("map-view").hidden = view !== "map";
    $("duplicates-view").hidden = view !== "duplicates";
    $("grid").replaceChildren();
    say("", false);
    for (const listener of views.listeners) {
      listener(view, $("output").value);
    }
  },
};

// Little-endian typed arrays from the server's base64 (collection_views.py): one decode, no parse per point.
function unpack(text, Type) {
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  return new Type(bytes.buffer);
}

function outputPath(output) {
  return "/v1/outputs/" + encodeURIComponent(output);
}

// A card of the grid (gallery.js's) with the item's file name under it: the file a user keeps or drops. Its full
// path is the tooltip; both are text.
function itemCard(item) {
  const figure = card(item);
  const file = document.createElement("small");
  file.className = "file";
  file.textContent = fileName(item.path);
  file.title = item.path || "";
  figure.querySelector("figcaption").appendChild(file);
  return figure;
}

function fileName(path) {
  return path ? String(path).split("/").pop() : "";
}

async function records(output, places) {
  if (!places.length) {
    return [];
  }
  const body = await answer(await fetch(outputPath(output) + "/records?at=" + places.join(",")));
  return body.data;
}

// The items at these places as cards in the grid, a page at a time ("More" lists the next).
async function listItems(output, places, title) {
  const grid = $("grid");
  grid.replaceChildren();
  let shown = 0;
  async function more() {
    const next = places.slice(shown, shown + GRID_PAGE);
    const found = await records(output, next);
    shown += next.length;
    const button = grid.querySelector("button.more");
    if (button) {
      button.remove();
    }
    grid.append(...found.map(itemCard));
    if (shown < places.length) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "more";
      button.textContent = "More (" + (places.length - shown) + " left)";
      button.addEventListener("click", () => more().catch((e) => say(e.message, true)));
      grid.appendChild(button);
    }
    say(title + ": " + places.length + " items, " + shown + " shown", false);
  }
  await more();
}

// ------------------------------------------------------------------------------------------ duplicates

const duplicates = { output: null, next: 0 };

function groupCard(item) {
  const figure = itemCard(item);
  const note = document.createElement("span");
  note.className = item.keep ? "mark kept" : "mark";
  note.textContent = item.keep ? "kept" : "similarity " + item.similarity.toFixed(4);
  figure.querySelector("figcaption").prepend(note);
  if (item.keep) {
    figure.classList.add("kept");
  }
  return figure;
}

function groupRow(group) {
  const article = document.createElement("article");
  article.className = "group";
  article.dataset.group = String(group.group);
  const heading = document.createElement("h2");
  const hidden = group.size - group.items.length;
  heading.textContent =
    "Group " + group.group + ": " + group.size + " items" + (hidden > 0 ? " (" + hidden + " more not shown)" : "");
  const row = document.createElement("div");
  row.className = "members";
  row.append(...group.items.map(groupCard));
  article.append(heading, row);
  return article;
}

async function loadGroups(output, fresh) {
  if (fresh) {
    duplicates.output = output;
    duplicates.next = 0;
    $("groups").replaceChildren();
    say("Loading the duplicates of " + output + " (found now if they were not yet)...", false);
  }
  const body = await answer(await fetch(outputPath(output) + "/duplicates?offset=" + duplicates.next + "&limit=30"));
  if (duplicates.output !== output) {
    return; // another collection was chosen meanwhile
  }
  $("groups").append(...body.data.map(groupRow));
  duplicates.next += body.data.length;
  $("more-groups").hidden = duplicates.next >= body.groups;
  say(body.groups + " groups of near-duplicates, " + body.items + " items, " + body.to_drop + " to drop", false);
}

views.onShow((view, output) => {
  if (view !== "duplicates") {
    return;
  }
  $("groups").replaceChildren();
  $("more-groups").hidden = true;
  if (output) {
    loadGroups(output, true).catch((e) => say(e.message, true));
  }
});

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("#views button")) {
    button.addEventListener("click", () => views.show(button.dataset.view));
  }
  $("output").addEventListener("change", () => views.show(views.current));
  $("more-groups").addEventListener("click", () => loadGroups(duplicates.output, false).catch((e) => say(e.message, true)));
  document.body.dataset.view = "search";
});
