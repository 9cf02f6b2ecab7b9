// The gallery's only script, served from this server (/static/gallery.js) under a Content-Security-Policy that
// allows no other. Every string from a collection reaches the page through textContent or a URL attribute the
// server built: never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

function say(text, isError) {
  const status = $("status");
  status.textContent = text;
  status.className = isError ? "error" : "";
}

async function answer(response) {
  let body = null;
  try {
    body = await response.json();
  } catch (e) {
    body = null;
  }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : response.status + " " + response.statusText;
    throw new Error(message);
  }
  return body;
}

async function loadOutputs() {
  const select = $("output");
  try {
    const body = await answer(await fetch("/v1/outputs"));
    for (const output of body.data) {
      const option = document.createElement("option");
      option.value = output.name;
      option.textContent = output.name + " (" + output.items + " " + output.modality + ")";
      option.dataset.textQueries = output.text_queries ? "1" : "";
      select.appendChild(option);
    }
    if (!body.data.length) {
      say("This server shows no collection: start it with --output OUT.safetensors.", true);
    }
    hintQueries();
  } catch (e) {
    say(e.message, true);
  }
}

function hintQueries() {
  const chosen = $("output").selectedOptions[0];
  const takesText = !chosen || chosen.dataset.textQueries === "1";
  $("text").disabled = !takesText;
  $("text").placeholder = takesText ? "Describe what to find" : "This collection is searched by image";
}

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error("cannot read " + file.name));
    reader.readAsDataURL(file);
  });
}

function card(hit) {
  const figure = document.createElement("figure");
  figure.className = "card";
  const picture = document.createElement("div");
  picture.className = "picture";
  if (hit.thumbnail) {
    const img = document.createElement("img");
    img.alt = hit.caption || hit.key;
    img.loading = "lazy";
    img.src = hit.thumbnail;
    picture.appendChild(img);
  }
  figure.appendChild(picture);
  const caption = document.createElement("figcaption");
  const score = document.createElement("span");
  score.className = "score";
  // a search hit's rank and score; the Map and Duplicates views' cards (views.js) have none
  score.textContent = hit.score == null ? "" : "#" + hit.rank + "  " + hit.score.toFixed(4) + "  ";
  caption.appendChild(score);
  const text = document.createElement("span");
  text.className = "caption";
  text.textContent = hit.caption || "";
  caption.appendChild(text);
  const key = document.createElement("small");
  key.className = "key";
  key.textContent = hit.key;
  caption.appendChild(key);
  figure.appendChild(caption);
  return figure;
}

async function search(event) {
  event.preventDefault();
  const request = { output: $("output").value, k: Number($("k").value) || 24 };
  const file = $("image").files[0];
  const text = $("text").value.trim();
  if (file) {
    request.input = await readFile(file);
    request.modality = "image";
  } else if (text) {
    request.input = text;
  } else {
    say("Type a query or choose an image.", true);
    return;
  }
  say("Searching...", false);
  const started = performance.now();
  try {
    const body = await answer(
      await fetch("/v1/search", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(request),
      }),
    );
    const grid = $("grid");
    grid.replaceChildren(...body.data.map(card));
    const ms = Math.round(performance.now() - started);
    say(body.data.length + " results from " + body.output + " in " + ms + " ms", false);
  } catch (e) {
    say(e.message, true);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("query").addEventListener("submit", search);
  $("output").addEventListener("change", hintQueries);
  $("text").addEventListener("input", () => {
    $("image").value = "";
  });
  $("image").addEventListener("change", () => {
    if ($("image").files.length) {
      $("text").value = "";
    }
  });
  loadOutputs();
});
