// routegate live dashboard: polls dashboard/data and draws plain canvas charts.
// No libraries and no build step, so the page works with no network beyond the gateway.
"use strict";

const POLL_MS = 2000;
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

function setupCanvas(canvas) {
  // Draw at device resolution so text stays sharp; returns a context in CSS pixels.
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 220;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "12px system-ui, sans-serif";
  canvas.dataset.shortened = 0;
  canvas.dataset.clipped = 0;
  return { ctx, w, h };
}

// Text drawn into a slot `max` px wide: shortened with an ellipsis rather than drawn
// over its neighbours or past the edge. Each canvas counts what it had to shorten
// (`data-shortened`) and what still does not fit (`data-clipped`, always 0).
function fitText(ctx, text, max) {
  text = String(text);
  if (ctx.measureText(text).width <= max) return text;
  ctx.canvas.dataset.shortened = Number(ctx.canvas.dataset.shortened || 0) + 1;
  let cut = text;
  while (cut.length > 1 && ctx.measureText(cut + "…").width > max) cut = cut.slice(0, -1);
  const fitted = cut + "…";
  if (ctx.measureText(fitted).width > max) {
    ctx.canvas.dataset.clipped = Number(ctx.canvas.dataset.clipped || 0) + 1;
  }
  return fitted;
}

function emptyNote(ctx, w, h, text) {
  ctx.fillStyle = css("--dim");
  ctx.textAlign = "center";
  ctx.fillText(text, w / 2, h / 2);
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= value) return m * p;
  return 10 * p;
}

function axes(ctx, w, h, max, pad, unit) {
  ctx.strokeStyle = css("--grid");
  ctx.fillStyle = css("--dim");
  ctx.textAlign = "right";
  for (let i = 0; i <= 4; i++) {
    const y = pad.top + (h - pad.top - pad.bottom) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(pad.left, y); ctx.lineTo(w - pad.right, y); ctx.stroke();
    const label = formatNumber(max * i / 4) + (i === 4 ? ` ${unit}` : "");
    ctx.fillText(fitText(ctx, label, pad.left - 8), pad.left - 6, y + 4);
  }
}

function formatNumber(v) {
  if (v === null || v === undefined) return "–";
  if (v === 0) return "0";
  if (v >= 1000) return (v / 1000).toFixed(1) + "k";
  if (v >= 10) return v.toFixed(0);
  return v.toFixed(v >= 1 ? 1 : 2);
}

// Grouped bars: for each group (backend), one bar per series at p50 with a p95 tick.
function groupedBars(canvas, groups, series) {
  const { ctx, w, h } = setupCanvas(canvas);
  const pad = { top: 10, right: 10, bottom: 28, left: 64 };
  let points = 0, max = 0;
  for (const g of groups) for (const s of series) {
    const v = g.values[s.key];
    if (v && v.p95 !== null) max = Math.max(max, v.p95);
    if (v && v.p50 !== null) max = Math.max(max, v.p50);
  }
  if (!groups.length) { emptyNote(ctx, w, h, "no traffic yet"); canvas.dataset.points = 0; return; }
  max = niceMax(max);
  axes(ctx, w, h, max, pad, "ms");
  const plotW = w - pad.left - pad.right, plotH = h - pad.top - pad.bottom;
  const groupW = plotW / groups.length;
  const barW = Math.min(40, (groupW * 0.7) / series.length);
  groups.forEach((g, gi) => {
    const x0 = pad.left + gi * groupW + (groupW - barW * series.length) / 2;
    series.forEach((s, si) => {
      const v = g.values[s.key];
      const x = x0 + si * barW;
      if (!v || v.p50 === null) {
        ctx.fillStyle = css("--dim"); ctx.textAlign = "center";
        ctx.fillText("n/a", x + barW / 2, pad.top + plotH - 4);
        return;
      }
      const y = pad.top + plotH * (1 - v.p50 / max);
      ctx.fillStyle = css(s.color);
      ctx.fillRect(x + 2, y, barW - 4, pad.top + plotH - y);
      points++;
      if (v.p95 !== null) {
        const y95 = pad.top + plotH * (1 - v.p95 / max);
        ctx.strokeStyle = css("--p95"); ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(x + 1, y95); ctx.lineTo(x + barW - 1, y95); ctx.stroke();
        ctx.lineWidth = 1;
      }
    });
    ctx.fillStyle = css("--ink"); ctx.textAlign = "center";
    ctx.fillText(fitText(ctx, g.name, groupW - 6), pad.left + gi * groupW + groupW / 2, h - 8);
  });
  canvas.dataset.points = points;
}

function rateChart(canvas, rate) {
  const { ctx, w, h } = setupCanvas(canvas);
  const pad = { top: 10, right: 16, bottom: 24, left: 64 };
  const max = niceMax(Math.max(...rate, 0));
  axes(ctx, w, h, max, pad, "req/s");
  const plotW = w - pad.left - pad.right, plotH = h - pad.top - pad.bottom;
  const step = plotW / Math.max(rate.length - 1, 1);
  // the time axis: seconds before now, the newest bucket at the right edge
  ctx.fillStyle = css("--dim");
  const ticks = [];
  for (let i = 0; i <= 4; i++) {
    const ago = Math.round(rate.length * (1 - i / 4));
    ticks.push(ago ? `−${ago} s` : "now");
    ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
    ctx.fillText(fitText(ctx, ticks[i], plotW / 4 - 4), pad.left + plotW * i / 4, h - 6);
  }
  canvas.dataset.timeAxis = ticks.join(" | ");
  ctx.strokeStyle = css("--e2e"); ctx.lineWidth = 2; ctx.beginPath();
  rate.forEach((v, i) => {
    const x = pad.left + i * step, y = pad.top + plotH * (1 - v / max);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke(); ctx.lineWidth = 1;
  canvas.dataset.points = rate.filter((v) => v > 0).length;
}

function shareChart(canvas, share) {
  const { ctx, w, h } = setupCanvas(canvas);
  const entries = Object.entries(share).sort((a, b) => b[1] - a[1]);
  const total = entries.reduce((sum, [, n]) => sum + n, 0);
  if (!total) { emptyNote(ctx, w, h, "no traffic yet"); canvas.dataset.points = 0; return; }
  const palette = ["--e2e", "--inf", "--p95", "--bad", "--dim"];
  const barH = Math.min(28, (h - 10) / entries.length - 6);
  entries.forEach(([name, n], i) => {
    const y = 5 + i * (barH + 6), width = (w - 200) * n / total;
    ctx.fillStyle = css(palette[i % palette.length]);
    ctx.fillRect(100, y, width, barH);
    ctx.fillStyle = css("--ink"); ctx.textAlign = "right";
    ctx.fillText(fitText(ctx, name, 90), 92, y + barH / 2 + 4);
    ctx.textAlign = "left";
    ctx.fillText(fitText(ctx, `${(100 * n / total).toFixed(0)}% (${n})`, w - 110 - width),
                 106 + width, y + barH / 2 + 4);
  });
  canvas.dataset.points = entries.length;
}

function fillTable(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  if (!rows.length) {  // an empty table says so rather than showing a bare header
    const tr = document.createElement("tr"), td = document.createElement("td");
    td.colSpan = document.querySelectorAll(`#${id} thead th`).length;
    td.className = "none";
    td.textContent = "none";
    tr.appendChild(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = cell;  // textContent: names come from the policy, never as HTML
      if (!tr.childElementCount) td.title = cell;  // the whole name, however it is shown
      tr.appendChild(td);
    }
    return tr;
  }));
}

function render(data) {
  const groups = Object.entries(data.backends).map(([name, b]) => ({ name, values: b }));
  groupedBars(document.getElementById("chart-e2e"), groups,
    [{ key: "e2e_ms", color: "--e2e" }, { key: "inference_ms", color: "--inf" }]);
  groupedBars(document.getElementById("chart-latency"), groups,
    [{ key: "queue_ms", color: "--e2e" }, { key: "ttft_ms", color: "--inf" }]);
  rateChart(document.getElementById("chart-rate"), data.rate_per_s);
  shareChart(document.getElementById("chart-share"), data.share);
  const unreported = groups.filter((g) => g.values.inference_reported === 0).map((g) => g.name);
  document.getElementById("inference-note").textContent = unreported.length
    ? `No inference time reported by: ${unreported.join(", ")} (shown as n/a, never estimated).`
    : "";
  fillTable("reasons", Object.entries(data.reasons).sort((a, b) => b[1] - a[1]));
  fillTable("rejections", Object.entries(data.rejections).sort((a, b) => b[1] - a[1]));
  fillTable("cache", Object.entries(data.cache || {}).sort((a, b) => b[1] - a[1]));
  // every backend of the policy, with or without traffic in the window
  const health = data.health || {};
  const names = [...new Set([...Object.keys(health), ...Object.keys(data.backends)])].sort();
  fillTable("backends", names.map((name) => {
    const b = data.backends[name], s = health[name] || {}, c = (b && b.status_classes) || {};
    return [name, s.state || "–", s.in_flight ?? "–", s.queue_depth ?? "–",
      b ? b.requests : 0, c["2xx"] || 0, c["4xx"] || 0, c["5xx"] || 0,
      b ? `${(100 * b.error_rate).toFixed(1)}%` : "–", b ? b.spend_usd.toFixed(4) : "0.0000"];
  }));
  const policy = data.policy;
  document.getElementById("policy").textContent = policy
    ? `policy ${policy.version || "(embedded)"} · loaded ${
      new Date(policy.loaded_at * 1000).toLocaleTimeString()}`
    : "";
  // failures in a row, and ejections so far
  fillTable("targets", Object.entries(data.targets || {}).map(([key, t]) =>
    [key, t.state.replace("_", " "), t.consecutive_failures, t.ejections_total]));
  // each replica of each fleet: how busy, how full, how often its prefix cache hit
  const percent = (value) => (value == null ? "–" : `${(100 * value).toFixed(1)}%`);
  fillTable("replicas", Object.entries(data.fleets || {}).flatMap(([backend, fleet]) =>
    Object.entries(fleet.replicas).map(([name, r]) =>
      [`${backend} ${name}`, r.state.replace("_", " "),
        Math.max(r.outstanding, (r.waiting || 0) + (r.running || 0)), percent(r.kv_cache_use),
        r.requests, percent(r.cache_hit_rate), r.index_blocks])));
  // batch lines on dedicated vs shared capacity, and the cost against all-shared
  fillTable("batches", Object.entries(data.batches || {}).map(([id, b]) =>
    [id, b.status, `${b.done}/${b.total}`, b.dedicated_lines, b.shared_lines,
      "$" + (b.cost_micros / 1e6).toFixed(4), "$" + (b.all_shared_cost_micros / 1e6).toFixed(4)]));
  document.getElementById("spend").textContent = "$" + data.spend_usd.toFixed(4);
  document.getElementById("status").textContent =
    `${data.requests} requests in the last ${data.window_s} s · updated ${new Date().toLocaleTimeString()}`;
  // a panel wider than its box hides text behind a scroll bar: counted, for the tests
  document.body.dataset.overflowing = [...document.querySelectorAll("section")]
    .filter((section) => section.scrollWidth > section.clientWidth + 1).length;
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered) + 1);
}

// An admin key, when the gateway asks for one, travels in the URL fragment: never
// sent to the server with the page request, never in an access log.
const ADMIN_KEY = new URLSearchParams(location.hash.slice(1)).get("key");
const AUTH = ADMIN_KEY ? { Authorization: `Bearer ${ADMIN_KEY}` } : {};

async function poll() {
  try {
    const response = await fetch("dashboard/data", { cache: "no-store", headers: AUTH });
    if (response.status === 401 || response.status === 403) {
      throw new Error(`HTTP ${response.status}: open this page as /dashboard#key=ADMIN_KEY`);
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
  } catch (err) {
    document.getElementById("status").textContent = `data unavailable: ${err.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
