// The live view, drawn in the browser from compact frames (dgemma/ui/compact.py).
// Runs as gr.HTML's js_on_load: `element` is the component, `props.value` the frame, `watch` calls
// back when a new frame arrives. Three parts: the overview (one row per request, one cell per canvas
// position, on a <canvas>), the focus card (one request's canvas in full), and the cards (each
// canvas clipped to its first CARD_TOKENS tokens, "show all" expands one). A card is rebuilt only
// when its row changed, so a frame costs the browser what changed, not 8,192 token boxes.
// SCHEMA (the cells' characters, their levels, the pieces' separator) is dgemma/ui/compact.py's,
// handed over by dgemma/ui/board_view.py before this script.
const {cells: CELLS, levels: LEVELS, sep: SEP} = SCHEMA;
const CARD_TOKENS = 48, GUTTER = 34;
const STATE = {};
for (const [state, chars] of Object.entries(CELLS)) [...chars].forEach((c, i) => { STATE[c] = [state, (i + 0.5) / LEVELS]; });
const RGB = {accepted: [46, 125, 50], noise: [120, 120, 120], committed: [21, 101, 192]};
const ALPHA = {accepted: [0.08, 0.62], noise: [0.2, 0.3], committed: [0.15, 0.7]};  // noise: a random start shows, as the legend's grey
const WORD = {accepted: "accepted", noise: "re-noised", committed: "committed"};
const COLOR = {};  // the fill of each cell character, made once
for (const [c, [state, level]] of Object.entries(STATE)) {
  const [r, g, b] = RGB[state], [a0, a1] = ALPHA[state];
  COLOR[c] = `rgba(${r},${g},${b},${(a0 + a1 * level).toFixed(3)})`;
}

const root = element.querySelector(".dgv");
const overview = root.querySelector(".dgv-overview");
const canvas = overview.querySelector("canvas");
const tip = overview.querySelector(".dgv-tip");
const focusBox = root.querySelector(".dgv-focus");
const cardsBox = root.querySelector(".dgv-cards"), IDLE = cardsBox.innerHTML;  // the template's: which button to press
const view = {frame: null, pieces: new Map(), drawn: new Map(), expanded: new Set(), focus: null, cursor: [0, 0], geometry: null};

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const rows = () => (view.frame && view.frame.rows) || [];

function piecesOf(row) {  // a row's pieces, split once per row string
  let hit = view.pieces.get(row.request);
  if (!hit || hit[0] !== row.pieces) { hit = [row.pieces, row.pieces ? row.pieces.split(SEP) : []]; view.pieces.set(row.request, hit); }
  return hit[1];
}

function drawOverview() {
  const list = rows();
  overview.hidden = !list.length;
  if (!list.length) return;
  const cols = Math.max(view.frame.canvas_length || 0, ...list.map((r) => r.cells.length), 1);
  const width = Math.max(200, overview.clientWidth || 800) - GUTTER;
  const cw = Math.max(1, Math.min(24, Math.floor(width / cols)));
  const ch = Math.max(3, Math.min(16, Math.floor(320 / list.length)));
  const dpr = window.devicePixelRatio || 1;
  const w = GUTTER + cols * cw, h = list.length * ch;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    canvas.style.width = w + "px"; canvas.style.height = h + "px";
  }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.fillStyle = "#ffffff"; g.fillRect(0, 0, w, h);
  g.font = `${Math.min(12, ch)}px ui-monospace, monospace`; g.textBaseline = "middle";
  const runs = {};  // the cells of each colour, drawn colour by colour: few fillStyle changes
  list.forEach((row, y) => {
    if (ch >= 8) { g.fillStyle = "#333333"; g.fillText(`#${row.index}`, 2, y * ch + ch / 2); }
    for (let x = 0; x < row.cells.length; x++) {
      const c = row.cells[x];
      if (COLOR[c]) (runs[c] ||= []).push(GUTTER + x * cw, y * ch);
    }
  });
  const wd = Math.max(1, cw - (cw > 3)), ht = Math.max(1, ch - (ch > 4));
  for (const [c, xy] of Object.entries(runs)) {
    g.fillStyle = COLOR[c];
    for (let i = 0; i < xy.length; i += 2) g.fillRect(xy[i], xy[i + 1], wd, ht);
  }
  list.forEach((row, y) => {
    if (view.focus === row.request) { g.strokeStyle = "#1a1a1a"; g.lineWidth = 1; g.strokeRect(GUTTER - 1.5, y * ch + 0.5, cols * cw + 2, ch - 1); }
  });
  const [cy, cx] = view.cursor;
  if (document.activeElement === canvas && list[cy]) {
    g.strokeStyle = "#000000"; g.lineWidth = 2; g.strokeRect(GUTTER + cx * cw, cy * ch, cw, ch);
  }
  view.geometry = {cw, ch, cols};
  canvas.dataset.rows = String(list.length); canvas.dataset.cols = String(cols);  // what it shows (the tests read it)
}

function tokens(row, limit) {
  if (row.step === null || row.step === undefined) return "";
  const pieces = piecesOf(row), n = Math.min(limit, row.cells.length), out = [];
  for (let i = 0; i < n; i++) {
    const [state, c] = STATE[row.cells[i]] || ["noise", 0];
    const cls = state === "noise" ? "tok noise" : "tok acc";
    out.push(`<span class="${cls}" style="--c:${c.toFixed(2)}" title="${esc(JSON.stringify(pieces[i] ?? ""))} · confidence ≈ ${c.toFixed(2)}">${esc(pieces[i] ?? "")}</span>`);
  }
  return out.join("");
}

function pinnable(row) {  // a finished card's text, its first canvas's tokens clickable to pin (first_canvas.py)
  const spans = row.first.split(SEP).map((piece, i) => piece === "" ? "" :
    `<span class="ctok" data-pos="${i}" data-piece="${esc(piece)}" title="${esc(JSON.stringify(piece))} · click to pin">${esc(piece.replace(/\u2581/g, " "))}</span>`);
  const first = row.first.split(SEP).join("").replace(/\u2581/g, " "), text = row.text || "";  // the first canvas's text
  // The rest of the text: what follows the first canvas (the frame's text is its end, when long).
  const rest = text.startsWith(first) ? text.slice(first.length) : " " + text;
  return spans.join("") + esc(rest);
}

function card(row, full) {
  const limit = full || view.expanded.has(row.request) ? Infinity : CARD_TOKENS;
  const more = row.step !== null && row.step !== undefined && row.cells.length > CARD_TOKENS && !full;
  const toggle = more ? `<button type="button" class="dgv-more" data-expand="${row.request}" aria-expanded="${view.expanded.has(row.request)}">` +
    (view.expanded.has(row.request) ? "show fewer" : `show all ${row.cells.length} tokens`) + "</button>" : "";
  const committed = row.first !== undefined ? pinnable(row) : row.text ? esc(row.text) :
    `<span class="empty">${row.status === "done" ? "empty: the model ended the text at once" : "nothing committed yet"}</span>`;
  // Refine names its row (a compare card's side is its view's); the server reads the prompt, seed and start text off that run.
  const refine = row.refine === undefined ? "" : `<button type="button" class="refine" title="run it again, its first canvas starting from this text" ` +
    `data-request="${row.index}">Refine</button>`;
  const seed = row.seed === null || row.seed === undefined ? "" : `<span class="seed">· seed ${row.seed}</span>`;
  return `<div class="card status-${esc(row.status)}${full ? " dgv-focused" : ""}" data-request="${row.request}" data-step="${row.step ?? 0}">` +
    `<div class="card-head"><b title="engine request ${row.request}">#${row.index}</b>${seed}<span class="status" title="${esc(row.label)}">${esc(row.label)}</span>${refine}` +
    (full ? `<button type="button" class="dgv-close" aria-label="close the focus card">close</button>` : "") + "</div>" +
    `<div class="prompt" title="prompt">${esc(row.prompt)}</div>` + (row.note ? `<div class="note" role="note">${esc(row.note)}</div>` : "") +
    `<div class="committed">${committed}</div><div class="canvas">${tokens(row, limit)}</div>` +
    (row.meter && row.step !== null && row.step !== undefined ? `<div class="meter">${esc(row.meter)}</div>` : "") + toggle + "</div>";
}

function drawCards() {
  const list = rows();
  if (!list.length) {
    cardsBox.innerHTML = IDLE;
    view.drawn.clear();
    return;
  }
  const ids = list.map((r) => r.request).join(",");
  if (cardsBox.dataset.ids !== ids) {  // another run: new cards
    cardsBox.innerHTML = list.map((r) => `<div class="dgv-slot" data-slot="${r.request}"></div>`).join("");
    cardsBox.dataset.ids = ids; view.drawn.clear();
  }
  const slots = cardsBox.children;
  list.forEach((row, i) => {
    const key = JSON.stringify(row) + view.expanded.has(row.request);
    if (view.drawn.get(row.request) === key) return;
    view.drawn.set(row.request, key);
    slots[i].innerHTML = card(row, false);
  });
}

function drawFocus() {
  const row = rows().find((r) => r.request === view.focus);
  focusBox.innerHTML = row ? card(row, true) :
    '<p class="dgv-hint">Click a row of the overview (or move to it with the arrow keys and press Enter) to see that request\'s canvas in full here.</p>';
}

function draw() { drawOverview(); drawFocus(); drawCards(); }

function at(event) {
  const g = view.geometry, rect = canvas.getBoundingClientRect();
  if (!g) return null;
  const x = Math.floor((event.clientX - rect.left - GUTTER) / g.cw), y = Math.floor((event.clientY - rect.top) / g.ch);
  const row = rows()[y];
  return row && x >= 0 && x < row.cells.length ? [y, x] : null;
}

function showTip(y, x, left, top) {
  const row = rows()[y];
  if (!row) { tip.hidden = true; return; }
  const [state, c] = STATE[row.cells[x]] || ["empty", 0], piece = piecesOf(row)[x];
  tip.textContent = `#${row.index} · position ${x + 1} · ${WORD[state] || "empty"} · confidence ≈ ${c.toFixed(2)}` +
    (piece !== undefined ? ` · ${JSON.stringify(piece)}` : "");
  tip.hidden = false;
  tip.style.left = `${left}px`; tip.style.top = `${top}px`;
}

canvas.addEventListener("mousemove", (e) => {
  const hit = at(e);
  if (!hit) { tip.hidden = true; return; }
  const rect = overview.getBoundingClientRect();
  showTip(hit[0], hit[1], e.clientX - rect.left + 12, e.clientY - rect.top + 12);
});
canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
canvas.addEventListener("click", (e) => { const hit = at(e); if (hit) { view.focus = rows()[hit[0]].request; view.cursor = hit; draw(); } });
canvas.addEventListener("keydown", (e) => {
  const list = rows(), g = view.geometry;
  if (!list.length || !g) return;
  let [y, x] = view.cursor;
  const moves = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1], Home: [0, -1e6], End: [0, 1e6]};
  if (moves[e.key]) {
    y = Math.max(0, Math.min(list.length - 1, y + moves[e.key][0]));
    x = Math.max(0, Math.min(list[y].cells.length - 1, x + moves[e.key][1]));
    view.cursor = [y, x];
  } else if (e.key === "Enter" || e.key === " ") {
    view.focus = list[y].request;
  } else if (e.key === "Escape") {
    view.focus = null;
  } else return;
  e.preventDefault();
  draw();
  showTip(y, x, GUTTER + x * g.cw + 8, (y + 1) * g.ch + 4);
});
canvas.addEventListener("focus", () => drawOverview());
canvas.addEventListener("blur", () => { tip.hidden = true; drawOverview(); });
root.addEventListener("click", (e) => {
  const more = e.target.closest(".dgv-more");
  if (more) {
    const id = Number(more.dataset.expand);
    view.expanded.has(id) ? view.expanded.delete(id) : view.expanded.add(id);
    drawCards();
    cardsBox.querySelector(`.dgv-more[data-expand="${id}"]`)?.focus();
  } else if (e.target.closest(".dgv-close")) {
    view.focus = null; drawOverview(); drawFocus(); canvas.focus();
  }
});
new ResizeObserver(() => drawOverview()).observe(overview);

function apply() {
  const started = performance.now();
  view.frame = props.value && typeof props.value === "object" ? props.value : {rows: []};
  if (!rows().some((r) => r.request === view.focus)) view.focus = null;
  draw();
  void cardsBox.offsetHeight;  // style and layout of what changed, inside the measured time
  root.dataset.applyMs = (performance.now() - started).toFixed(1);  // what drawing this frame took (the tests read it)
  root.dataset.frames = String(Number(root.dataset.frames || 0) + 1);
  acknowledge(view.frame);
}

// A streamed frame carries its stream's token and sequence number: saying it is drawn lets the
// server send the next (dgemma/serving/acks.py), so a slow link carries one frame at a time, the latest.
// Posting once as the view loads sets the cookie that tells the server, before this page's first
// stream, that its frames will be acknowledged.
const ACK_URL = new URL("dgemma-ack", document.baseURI);
function acknowledge(frame) {
  if (!frame.ack || !frame.seq) return;
  fetch(ACK_URL, {method: "POST", body: `${frame.ack} ${frame.seq}`, keepalive: true}).catch(() => {});
}
if (!window.dgvAcknowledges) {
  window.dgvAcknowledges = true;
  fetch(ACK_URL, {method: "POST", body: "", keepalive: true}).catch(() => {});
}
apply();
watch("value", apply);
root.dgvRedraw = () => { view.drawn.clear(); apply(); };  // every card drawn anew, as a run's new frame does
