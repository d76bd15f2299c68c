// nmt web page: translate (n-best, scores, timing, cross-attention heatmap) and the run's curves/evals.
// Plain browser JavaScript, no build step and no external resources; talks to the JSON API of nmt/serve.py.
"use strict";

const $ = (id) => document.getElementById(id);

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// The run's direction (data.direction), from /info; the page starts as zh → en until it answers.
const LANGUAGES = {
  zh: { name: "中文", prompt: "输入中文，一行一句。 (Ctrl+Enter translates)", empty: "Type a Chinese sentence first." },
  en: { name: "English", prompt: "English text, one sentence per line. (Ctrl+Enter translates)",
        empty: "Type an English sentence first." },
};
let languages = { source: "zh", target: "en" };

function applyLanguages(found) {
  if (!found || !LANGUAGES[found.source] || !LANGUAGES[found.target]) return;
  languages = found;
  const src = LANGUAGES[found.source], tgt = LANGUAGES[found.target];
  $("direction").textContent = `${src.name} → ${tgt.name}`;
  document.title = `nmt · ${src.name} → ${tgt.name}`;
  $("source").placeholder = src.prompt;
  $("source").lang = found.source;
}

const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));

// ------------------------------------------------------------------ translate view

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function translate(event) {
  event.preventDefault();
  const lines = $("source").value.split("\n").map((s) => s.trim()).filter((s) => s);
  if (!lines.length) return showError(LANGUAGES[languages.source].empty);
  const beam = Number($("beam").value);
  const nbest = Math.min(Number($("nbest").value), beam);
  showError("");
  $("go").disabled = true;
  const started = performance.now();
  try {
    const data = await api("/translate", { text: lines, beam, nbest });
    const ms = performance.now() - started;
    $("timing").textContent =
      `${lines.length} sentence(s) in ${(ms / 1000).toFixed(2)} s (model ${data.seconds.toFixed(2)} s; ` +
      `beam ${data.settings.beam}, ${data.settings.engine} ${data.settings.precision})`;
    renderResults(lines, data.translations);
  } catch (error) {
    showError(error.message);
  } finally {
    $("go").disabled = false;
  }
}

function renderResults(lines, translations) {
  const list = $("results");
  list.replaceChildren();
  translations.forEach((entry, i) => {
    const hyps = entry.nbest || [{ text: entry.text, score: entry.score }];
    const item = el("li", { class: "result" }, el("div", { class: "src", lang: languages.source }, lines[i]));
    hyps.forEach((hyp, rank) => {
      const row = el("div", { class: rank === 0 ? "hyp best" : "hyp", title: "show the cross-attention map" },
        el("span", { class: "text", lang: languages.target }, hyp.text), el("span", { class: "score" }, fmt(hyp.score, 3)));
      row.addEventListener("click", () => selectHypothesis(row, lines[i], hyp.text));
      item.append(row);
    });
    list.append(item);
  });
  const first = list.querySelector(".hyp");
  if (first) first.click();
}

async function selectHypothesis(row, source, target) {
  document.querySelectorAll(".hyp.selected").forEach((node) => node.classList.remove("selected"));
  row.classList.add("selected");
  try {
    const map = await api("/attention", { text: source, translation: target });
    $("attention-title").textContent = `${source} → ${target}`;
    $("attention-box").hidden = false;
    drawHeatmap($("heatmap"), map);
  } catch (error) {
    $("attention-box").hidden = true;
    showError(`attention map: ${error.message}`);
  }
}

// Heatmap: target pieces down the left, source pieces across the top, white → blue by weight.
function drawHeatmap(canvas, map) {
  const cell = 26, ctx = canvas.getContext("2d");
  const font = "12px system-ui, 'Noto Sans CJK SC', sans-serif";
  ctx.font = font;
  const left = 16 + Math.max(...map.target.map((p) => ctx.measureText(p).width));
  const top = 16 + Math.max(...map.source.map((p) => ctx.measureText(p).width)) * 0.75;
  const ratio = window.devicePixelRatio || 1;
  const width = left + cell * map.source.length + top, height = top + cell * map.target.length + 8;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  ctx.font = font;
  map.weights.forEach((row, t) => row.forEach((w, s) => {
    const light = Math.round(255 - 200 * w);
    ctx.fillStyle = `rgb(${light}, ${Math.round(255 - 150 * w)}, 255)`;
    ctx.fillRect(left + s * cell, top + t * cell, cell - 1, cell - 1);
  }));
  ctx.fillStyle = "#1d232b";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  map.target.forEach((piece, t) => ctx.fillText(piece, left - 6, top + t * cell + cell / 2));
  map.source.forEach((piece, s) => {
    ctx.save();
    ctx.translate(left + s * cell + cell / 2, top - 6);
    ctx.rotate(-Math.PI / 4);
    ctx.textAlign = "left";
    ctx.fillText(piece, 0, 0);
    ctx.restore();
  });
  canvas.dataset.rows = map.target.length;
  canvas.dataset.cols = map.source.length;
  canvas.onmousemove = (e) => {
    const box = canvas.getBoundingClientRect();
    const s = Math.floor((e.clientX - box.left - left) / cell), t = Math.floor((e.clientY - box.top - top) / cell);
    const inside = t >= 0 && s >= 0 && t < map.target.length && s < map.source.length;
    $("heat-value").textContent = inside ? `${map.target[t]} ← ${map.source[s]}: ${fmt(map.weights[t][s], 3)}` : "\u00a0";
  };
}

// ------------------------------------------------------------------ run view

async function loadRun() {
  const [info, evals, curves] = await Promise.all([api("/info"), api("/run/evals"), api("/run/curves")]);
  const rows = [
    ["model", info.model], ["checkpoint", info.checkpoint], ["step", info.step],
    ["architecture", Object.entries(info.config).map(([k, v]) => `${k} ${v}`).join(", ")],
    ["direction", `${languages.source} → ${languages.target}`],
    ["vocabularies", `${languages.source} ${info.vocab.src}, ${languages.target} ${info.vocab.tgt}`],
    ["decoding", Object.entries(info.decoding).map(([k, v]) => `${k} ${v}`).join(", ")],
  ];
  $("info").replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v ?? "–")))));
  const body = $("evals").querySelector("tbody");
  body.replaceChildren(...evals.map((r) => el("tr", {},
    el("td", {}, r.name), el("td", {}, fmt(r.bleu)), el("td", {}, fmt(r.chrf)),
    el("td", {}, `beam ${r.decode.beam}, ${r.decode.engine} ${r.decode.precision} on ${r.decode.device}`),
    el("td", {}, r.speed ? `${r.speed.sentences_per_s} sent/s` : "–"),
    el("td", { class: "sig" }, `${r.bleu_signature}\n${r.chrf_signature}`))));
  if (!evals.length) body.append(el("tr", {}, el("td", { colspan: 6 }, "no eval reports yet (nmt eval)")));
  const charts = curves.main.map(([tag, title, unit]) => lineChart(title, unit, curves.curves[tag]));
  $("curves").replaceChildren(...(charts.length ? charts : [el("p", { class: "dim" }, "no training scalars recorded")]));
}

// A line chart in SVG: steps on x, values on y, 4 grid lines with labels.
function lineChart(title, unit, series) {
  const W = 440, H = 220, L = 58, R = 10, T = 10, B = 30, NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
  };
  const xs = series.steps, ys = series.values;
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 - y0 < 1e-12) { y0 -= 1; y1 += 1; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    add("line", { class: "grid", x1: L, x2: W - R, y1: py(y), y2: py(y) });
    add("text", { x: L - 4, y: py(y) + 4, "text-anchor": "end" }, Math.abs(y) < 0.01 && y !== 0 ? y.toExponential(1) : y.toPrecision(3));
  }
  add("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B });
  add("text", { x: L, y: H - 8 }, String(x0));
  add("text", { x: W - R, y: H - 8, "text-anchor": "end" }, `step ${x1}`);
  add("polyline", { class: "line", points: xs.map((x, i) => `${px(x)},${py(ys[i])}`).join(" ") });
  if (xs.length < 40) xs.forEach((x, i) => add("circle", { class: "dot", cx: px(x), cy: py(ys[i]), r: 2.5 }));
  const box = el("div", { class: "chart" }, el("h3", {}, `${title} `, el("span", { class: "dim" }, unit)));
  box.append(svg);
  return box;
}

// ------------------------------------------------------------------ start

function showView(button) {
  document.querySelectorAll(".tab").forEach((b) => b.classList.toggle("active", b === button));
  document.querySelectorAll(".view").forEach((v) => { v.hidden = v.id !== button.dataset.view; });
  if (button.dataset.view === "view-run") loadRun().catch((e) => showError(e.message));
}

async function start() {
  document.querySelectorAll(".tab").forEach((b) => b.addEventListener("click", () => showView(b)));
  $("form").addEventListener("submit", translate);
  $("source").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
  });
  try {
    const info = await api("/info");
    applyLanguages(info.languages);
    $("model").textContent = `${info.model} · ${info.decoding.engine} ${info.decoding.precision} on ${info.decoding.device}`;
    $("beam").value = info.decoding.beam;
    $("beam").max = info.limits.max_beam;
    $("nbest").value = Math.min(3, info.decoding.beam);
  } catch (error) {
    showError(`server: ${error.message}`);
  }
}

start();
