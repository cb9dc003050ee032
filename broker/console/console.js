// queen console: a small single-page app over the broker's public HTTP API. No framework, no build.
// Every call carries the operator's bearer token (sessionStorage, this tab only); every refusal is shown
// as the API's envelope {error, reason, detail}, never as a blank page.
"use strict";

const TOKEN_KEY = "queen.console.token";
const view = document.getElementById("view");
const flash = document.getElementById("flash");
const state = { timersQueue: null, timersAfter: [], dlqOffset: 0, dlqFilters: {}, view: null,
  samples: [], sampler: null, liveError: null, charts: {}, backlogSet: "" };
const SAMPLE_MS = 2000, KEEP_MS = 10 * 60 * 1000;

// ---------------------------------------------------------------- helpers

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function fmt(v) { return v === null || v === undefined || v === "" ? "—" : esc(v); }
function num(v) { return v === null || v === undefined ? "—" : Number(v).toLocaleString("en-US"); }
function ago(iso) {
  if (!iso) return "—";
  const s = (Date.now() - Date.parse(iso)) / 1000;
  const a = Math.abs(s), unit = a < 120 ? `${a.toFixed(0)} s` : a < 7200 ? `${(a / 60).toFixed(0)} min` : `${(a / 3600).toFixed(1)} h`;
  return `${esc(iso)} <span class="muted">(${s >= 0 ? unit + " ago" : "in " + unit})</span>`;
}
function enc(s) { return encodeURIComponent(s); }
// timer keys may hold "/": keep them as path segments, encode the rest
function encKey(k) { return String(k).split("/").map(encodeURIComponent).join("/"); }

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.detail ? body.detail : `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, { error: "network", reason: "unreachable", detail: `the broker did not answer: ${e.message}` });
  }
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = { error: "bad_answer", reason: "not_json", detail: text.slice(0, 200) }; }
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

function errorHtml(e, what) {
  if (!(e instanceof ApiError)) return `<div class="error">${esc(what ? what + ": " : "")}${esc(e.message || e)}</div>`;
  const b = e.body || {};
  let hint = "";
  if (e.status === 401) hint = " Enter a valid token above.";
  if (e.status === 403 && b.reason === "missing_grant") hint = " Sign in with a token that has it to see this panel.";
  return `<div class="error" data-status="${e.status}">${what ? esc(what) + ": " : ""}<code>${e.status} ${esc(b.error || "")}</code>` +
    (b.reason ? ` (reason <code>${esc(b.reason)}</code>)` : "") + ` — ${esc(String(b.detail || e.message).replace(/\.$/, ""))}.${hint}</div>`;
}
function showFlash(html) { flash.innerHTML = html; }
function clearFlash() { flash.innerHTML = ""; }

// Run a section's loader into its own element: a refusal there is a message in that section only.
async function section(el, loader, what) {
  try { el.innerHTML = await loader(); } catch (e) { el.innerHTML = errorHtml(e, what); }
}

function table(cols, rows, opts = {}) {
  if (!rows.length) return `<p class="muted">${esc(opts.empty || "nothing")}</p>`;
  const head = cols.map((c) => `<th class="${c.num ? "num" : ""}">${esc(c.label)}</th>`).join("");
  const body = rows.map((r) => {
    const attrs = opts.rowAttrs ? opts.rowAttrs(r) : "";
    return `<tr ${attrs}>` + cols.map((c) => `<td class="${c.num ? "num" : ""}">${c.html(r)}</td>`).join("") + "</tr>";
  }).join("");
  return `<table${opts.id ? ` id="${opts.id}"` : ""}><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

// ---------------------------------------------------------------- identity

async function whoami() {
  const who = document.getElementById("who");
  try {
    const w = await api("GET", "/api/v1/whoami");
    who.textContent = `tenant ${w.tenant} · sub ${w.sub} · grants ${w.grants.join(", ") || "none"}`;
    return w;
  } catch (e) {
    who.textContent = e instanceof ApiError ? `not signed in (${e.status} ${e.body.error || ""})` : "broker unreachable";
    return null;
  }
}

// ---------------------------------------------------------------- queues

async function viewQueues(arg) {
  if (arg) return viewQueue(arg);
  view.innerHTML = `<h2>Queues</h2><div id="queues-list">Loading…</div>`;
  await section(document.getElementById("queues-list"), async () => {
    const data = await api("GET", "/api/v1/resources/queues");
    const queues = data.queues || [];
    // DLQ count per queue: the DLQ route's total for that queue (at most 100 queues asked)
    const dlq = await Promise.all(queues.slice(0, 100).map((q) =>
      api("GET", `/api/v1/dlq?queue=${enc(q.name)}&limit=1`).then((d) => d.total, (e) => (e instanceof ApiError ? `${e.status}` : "?"))));
    return table([
      { label: "queue", html: (q) => `<a href="#queues/${enc(q.name)}">${esc(q.name)}</a>` },
      { label: "namespace / task", html: (q) => fmt([q.namespace, q.task].filter(Boolean).join(" / ")) },
      { label: "partitions", num: true, html: (q) => num(q.partitions) },
      { label: "messages stored", num: true, html: (q) => num(q.messages) },
      { label: "DLQ", num: true, html: (q) => `<a href="#dlq/${enc(q.name)}">${num(dlq[queues.indexOf(q)])}</a>` },
      { label: "lease s / retries", html: (q) => `${fmt(q.options?.leaseTime)} / ${fmt(q.options?.retryLimit)}` },
    ], queues, { id: "queues-table", empty: "no queues yet (a queue exists after its first configure or push)" });
  }, "queues");
}

async function viewQueue(name) {
  view.innerHTML = `<h2>Queue <code>${esc(name)}</code> <a class="muted" href="#queues">(all queues)</a></h2><div id="queue-detail">Loading…</div>`;
  await section(document.getElementById("queue-detail"), async () => {
    const q = await api("GET", `/api/v1/resources/queues/${enc(name)}`);
    const dlq = await api("GET", `/api/v1/dlq?queue=${enc(name)}&limit=1`).then((d) => d.total, () => "?");
    const total = (q.partitions || []).reduce((s, p) => s + Number(p.messages || 0), 0);
    return `<div class="panel"><span class="stat">partitions<b>${num((q.partitions || []).length)}</b></span>` +
      `<span class="stat">messages stored<b>${num(total)}</b></span>` +
      `<span class="stat">in DLQ<b><a href="#dlq/${enc(name)}">${num(dlq)}</a></b></span></div>` +
      `<h3>Consumer groups</h3>` +
      table([
        { label: "group", html: (g) => (g.name === "__QUEUE_MODE__" ? "<i>queue mode</i>" : esc(g.name)) },
        { label: "lag (unacked messages)", num: true, html: (g) => num(g.pending) },
        { label: "leased partitions", num: true, html: (g) => num(g.leasedPartitions) },
        { label: "oldest unacked message", html: (g) => ago(g.oldestUnackedAt) },
      ], q.consumerGroups || [], { id: "groups-table", empty: "no consumer has popped from this queue yet" }) +
      `<h3>Partitions</h3>` +
      table([
        { label: "partition", html: (p) => esc(p.name) },
        { label: "messages stored", num: true, html: (p) => num(p.messages) },
        { label: "last push", html: (p) => ago(p.lastPushAt) },
      ], q.partitions || [], { id: "partitions-table" }) +
      `<h3>Options</h3><pre>${esc(JSON.stringify(q.options, null, 2))}</pre>`;
  }, `queue ${name}`);
}

// ---------------------------------------------------------------- timers

async function viewTimers(arg) {
  if (arg) { state.timersQueue = arg; state.timersAfter = [null]; }
  view.innerHTML = `<h2>Timers</h2>
    <div class="panel" id="lag-panel"><h3>Fire lag and rate (this broker's counters, sampled every 2 s; charts in <a href="#live">Live</a>)</h3>
      <div id="lag-stats" class="muted">sampling…</div><div id="lag-chart"></div></div>
    <h3>Pending per queue</h3><div id="timers-overview">Loading…</div>
    <h3>Next due</h3><div id="timers-next"></div>
    <h3>Timers of a queue</h3>
    <form class="filters" id="timers-form"><input id="timers-queue" placeholder="queue" value="${esc(state.timersQueue || "")}">
      <button type="submit">List</button>
      <input id="timer-key" placeholder="timer key"> <button type="button" id="peek-key">Peek</button>
      <button type="button" class="danger" id="cancel-key">Cancel</button></form>
    <div id="timers-result"></div><div id="timers-list"></div><div id="timer-peek"></div>`;
  document.getElementById("timers-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.timersQueue = document.getElementById("timers-queue").value.trim();
    state.timersAfter = [null];
    loadTimerPage();
  });
  document.getElementById("peek-key").addEventListener("click", () => peekTimer(currentQueue(), document.getElementById("timer-key").value));
  document.getElementById("cancel-key").addEventListener("click", () => cancelTimer(currentQueue(), document.getElementById("timer-key").value));
  renderLag();
  const ov = document.getElementById("timers-overview"), nx = document.getElementById("timers-next");
  try {
    const o = await api("GET", "/api/v1/timers-overview");
    ov.innerHTML = `<div class="panel"><span class="stat">pending (tenant)<b id="timers-pending">${num(o.pending)}</b></span>` +
      `<span class="muted">database clock ${esc(o.now)}${o.truncated ? " · per-queue counts stop at the first 50,000 rows" : ""}</span></div>` +
      table([
        { label: "queue", html: (r) => `<a href="#timers/${enc(r.queue)}">${esc(r.queue)}</a>` },
        { label: "pending", num: true, html: (r) => num(r.pending) },
        { label: "next due", html: (r) => ago(r.nextDueAt) },
        { label: "claimed now", num: true, html: (r) => num(r.claimed) },
        { label: "retrying", num: true, html: (r) => num(r.retrying) },
      ], o.queues, { id: "timers-queues", empty: "no pending timers" });
    nx.innerHTML = table([
      { label: "due", html: (r) => ago(r.dueAt) },
      { label: "queue", html: (r) => esc(r.queue) },
      { label: "timer key", html: (r) => esc(r.timerKey) },
      { label: "attempts", num: true, html: (r) => num(r.attempts) },
      { label: "claimed", html: (r) => (r.claimed ? "yes" : "") },
    ], o.next, { empty: "nothing due" });
  } catch (e) { ov.innerHTML = errorHtml(e, "timers overview"); nx.innerHTML = ""; }
  if (state.timersQueue) loadTimerPage();
}

function currentQueue() { return document.getElementById("timers-queue").value.trim() || state.timersQueue || ""; }

async function loadTimerPage() {
  const el = document.getElementById("timers-list");
  const q = state.timersQueue;
  if (!q) { el.innerHTML = ""; return; }
  const after = state.timersAfter[state.timersAfter.length - 1];
  const qs = `limit=20${after ? "&after=" + enc(after) : ""}`;
  try {
    const page = await api("GET", `/api/v1/timers/${enc(q)}?${qs}`);
    const n = state.timersAfter.length;
    el.innerHTML = `<p>Queue <code>${esc(q)}</code>, page ${n} (20 per page, in key order)</p>` + table([
      { label: "timer key", html: (r) => esc(r.timerKey) },
      { label: "deliver at", html: (r) => ago(r.deliverAt) },
      { label: "partition", html: (r) => esc(r.partition) },
      { label: "attempts", num: true, html: (r) => num(r.attempts) },
      { label: "last error", html: (r) => fmt(r.lastError) },
      { label: "", html: (r) => `<button data-peek="${esc(r.timerKey)}">Peek</button> <button class="danger" data-cancel="${esc(r.timerKey)}">Cancel</button>` },
    ], page.rows, { id: "timers-table", empty: "no pending timers in this queue" }) +
      `<button id="timers-prev" ${n > 1 ? "" : "disabled"}>Previous page</button> ` +
      `<button id="timers-next-page" ${page.truncated ? "" : "disabled"}>Next page</button>`;
    el.querySelectorAll("[data-peek]").forEach((b) => b.addEventListener("click", () => peekTimer(q, b.dataset.peek)));
    el.querySelectorAll("[data-cancel]").forEach((b) => b.addEventListener("click", () => cancelTimer(q, b.dataset.cancel)));
    document.getElementById("timers-prev").addEventListener("click", () => { state.timersAfter.pop(); loadTimerPage(); });
    document.getElementById("timers-next-page").addEventListener("click", () => { state.timersAfter.push(page.nextAfter); loadTimerPage(); });
  } catch (e) { el.innerHTML = errorHtml(e, `timers of ${q}`); }
}

async function peekTimer(q, key) {
  const el = document.getElementById("timer-peek");
  if (!q || !key) { el.innerHTML = `<div class="error">Give a queue and a timer key.</div>`; return; }
  try {
    const t = await api("GET", `/api/v1/timers/${enc(q)}/${encKey(key)}`);
    let decoded = "";
    if (t.found && t.payload && !t.payloadZstd && !t.encrypted) {
      try { decoded = `<h3>payload (decoded)</h3><pre>${esc(new TextDecoder().decode(Uint8Array.from(atob(t.payload), (c) => c.charCodeAt(0))))}</pre>`; } catch (_) { /* shown raw below */ }
    }
    el.innerHTML = `<h3>Peek <code>${esc(q)}</code> / <code>${esc(key)}</code></h3>` +
      (t.found ? "" : `<p class="muted">not pending (cancelled, fired, or never scheduled)</p>`) + `<pre id="peek-json">${esc(JSON.stringify(t, null, 2))}</pre>` + decoded;
  } catch (e) { el.innerHTML = errorHtml(e, "peek"); }
}

async function cancelTimer(q, key) {
  const el = document.getElementById("timers-result");
  if (!q || !key) { el.innerHTML = `<div class="error">Give a queue and a timer key.</div>`; return; }
  try {
    const r = await api("DELETE", `/api/v1/timers/${enc(q)}/${encKey(key)}`);
    el.innerHTML = r.ok
      ? `<div class="ok" id="cancel-result">Timer <code>${esc(key)}</code>: <b>${esc(r.status)}</b>.</div>`
      : `<div class="error" id="cancel-result">Timer <code>${esc(key)}</code>: <b>${esc(r.status)}</b>` +
        (r.status === "absent" ? " — no longer pending; it may already have been delivered." : r.status === "too_late" ? " — a sweeper is firing it right now." : "") + `</div>`;
    if (state.timersQueue === q) loadTimerPage();
  } catch (e) { el.innerHTML = errorHtml(e, "cancel"); }
}

// ---------------------------------------------------------------- live samples
// One sampler for the whole tab, from the moment the page opens: GET /api/v1/status/live every 2 s (the
// broker's counters and this tenant's backlog), the last 10 minutes kept in memory. Rates and quantiles
// are differences between two samples (as Prometheus' rate() and histogram_quantile() compute them).

function toSample(d) {
  const m = d.metrics, lag = m.fireLag;
  const buckets = lag.le.map((le, i) => [le, lag.counts[i]]).concat([[Infinity, lag.count]]);
  return { t: Date.now(), m, buckets, fired: m.timersFired, pending: m.timersPending, count: lag.count,
    queues: d.queues, other: d.otherQueues, deadLetters: d.deadLetters, backlog: d.pending };
}

async function takeSample() {
  try {
    state.samples.push(toSample(await api("GET", "/api/v1/status/live")));
    state.liveError = null;
    const cutoff = Date.now() - KEEP_MS;
    while (state.samples.length > 2 && state.samples[0].t < cutoff) state.samples.shift();
  } catch (e) {
    state.liveError = e;
  }
  if (state.view === "timers") renderLag();
  if (state.view === "live") renderLive();
}

function startSampler() {
  if (state.sampler) return;
  takeSample();
  state.sampler = setInterval(takeSample, SAMPLE_MS);
}

function quantile(q, a, b) {
  // a, b: samples (a older); the window's histogram is b - a, bucket by bucket
  const d = b.buckets.map(([le, c], i) => [le, c - ((a.buckets[i] || [le, 0])[1])]);
  const total = d.length ? d[d.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevC = 0;
  for (const [le, c] of d) {
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + (le - prevLe) * ((rank - prevC) / Math.max(c - prevC, 1e-9));
    }
    prevLe = le; prevC = c;
  }
  return prevLe;
}

function ms(s) { return s === null ? "—" : s < 1 ? `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms` : `${s.toFixed(2)} s`; }

function spark(points, label, unit) {
  const w = 360, h = 70, vals = points.map((p) => p[1]).filter((v) => v !== null);
  if (vals.length < 2) return "";
  const max = Math.max(...vals, 1e-9), t0 = points[0][0], t1 = points[points.length - 1][0];
  const xy = points.filter((p) => p[1] !== null).map((p) => `${((p[0] - t0) / Math.max(t1 - t0, 1) * (w - 4) + 2).toFixed(1)},${(h - 14 - p[1] / max * (h - 22)).toFixed(1)}`).join(" ");
  return `<svg class="spark" width="${w}" height="${h}" role="img" aria-label="${esc(label)}"><polyline fill="none" stroke="#3d5078" stroke-width="1.5" points="${xy}"/>` +
    `<text x="4" y="${h - 3}" font-size="10" fill="#6b7385">${esc(label)} (max ${esc(unit(max))}, last ${Math.round((t1 - t0) / 1000)} s)</text></svg>`;
}

function renderLag() {
  const el = document.getElementById("lag-stats"), chart = document.getElementById("lag-chart");
  if (el && state.liveError) { el.innerHTML = errorHtml(state.liveError, "live figures"); return; }
  if (!el || state.samples.length < 2) { if (el) el.textContent = "sampling… (two samples are needed)"; return; }
  const s = state.samples, last = s[s.length - 1], prev = s[s.length - 2];
  const oneMin = s.find((x) => x.t >= last.t - 60_000) || s[0];
  const first = s[0];
  const rate = (last.fired - prev.fired) / ((last.t - prev.t) / 1000);
  const rate1m = (last.fired - oneMin.fired) / Math.max((last.t - oneMin.t) / 1000, 1e-3);
  el.innerHTML =
    `<span class="stat">p50 last min<b id="lag-p50">${ms(quantile(0.5, oneMin, last))}</b></span>` +
    `<span class="stat">p99 last min<b id="lag-p99">${ms(quantile(0.99, oneMin, last))}</b></span>` +
    `<span class="stat">p99 last ${Math.round((last.t - first.t) / 60000) || "<1"} min<b>${ms(quantile(0.99, first, last))}</b></span>` +
    `<span class="stat">fired/s now<b id="fired-rate">${rate.toFixed(1)}</b></span>` +
    `<span class="stat">fired/s last min<b>${rate1m.toFixed(1)}</b></span>` +
    `<span class="stat">pending (cluster)<b>${num(last.pending)}</b></span>` +
    `<span class="muted">${num(last.count - oneMin.count)} fires in the last minute; cluster-wide figures, every tenant.</span>`;
  const p99 = [], fr = [];
  for (let i = 1; i < s.length; i++) {
    const base = s.find((x) => x.t >= s[i].t - 60_000) || s[0];
    p99.push([s[i].t, base === s[i] ? null : quantile(0.99, base, s[i])]);
    fr.push([s[i].t, (s[i].fired - s[i - 1].fired) / ((s[i].t - s[i - 1].t) / 1000)]);
  }
  chart.innerHTML = `<div class="row">${spark(p99, "fire lag p99 (1-min window)", ms)}${spark(fr, "fired/s", (v) => v.toFixed(1))}</div>`;
}

function rate(a, b, key) {
  const dt = (b.t - a.t) / 1000;
  return dt > 0 ? Math.max(0, (b.m[key] - a.m[key]) / dt) : 0;  // a counter never goes down: a reset reads 0
}

// ---------------------------------------------------------------- live charts (uPlot)

const PALETTE = ["#3d5078", "#d9822b", "#2b8a3e", "#c92a2a", "#7048e8", "#1098ad", "#a61e4d", "#5c940d", "#868e96"];

const COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7, 1e8];

function chartOpts(id, title, labels, unit) {
  const whole = id === "backlog" || id === "dlq", dashed = (i) => id === "rates" && i === 2;
  const box = document.getElementById("live-grid");
  const width = Math.max(320, Math.floor(((box && box.clientWidth) || 1200) / 2) - 28);
  return {
    title, width, height: 190,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    // counts (backlog, dead letters) get whole-number ticks only
    axes: [{}, Object.assign({ size: 60, values: (u, vals) => vals.map((v) => unit(v)) }, whole ? { incrs: COUNT_INCRS } : {})],
    // a dashed line for a series drawn over another (acked/s over popped/s when every pop is acked)
    series: [{}].concat(labels.map((label, i) => ({ label, stroke: PALETTE[i % PALETTE.length], width: dashed(i) ? 2 : 1.5,
      dash: dashed(i) ? [6, 4] : undefined, value: (u, v) => (v === null || v === undefined ? "—" : unit(v)) }))),
  };
}

// The charts' data from the samples: x in seconds; a rate or a quantile needs the sample before.
function liveData() {
  const s = state.samples, xs = [], push = [], pop = [], ack = [], fired = [], p50 = [], p99 = [], dlq = [];
  for (let i = 1; i < s.length; i++) {
    const a = s[i - 1], b = s[i], base = s.find((x) => x.t >= b.t - 60_000) || s[0];
    xs.push(b.t / 1000);
    push.push(rate(a, b, "pushed")); pop.push(rate(a, b, "popped")); ack.push(rate(a, b, "acked"));
    fired.push(rate(a, b, "timersFired"));
    p50.push(base === b ? null : quantile(0.5, base, b)); p99.push(base === b ? null : quantile(0.99, base, b));
    dlq.push(b.deadLetters);
  }
  // backlog: the queues of the latest sample (largest first), each followed back through the samples
  const last = s[s.length - 1], names = last ? last.queues.map((q) => q.name) : [];
  const backlog = names.map((n) => s.slice(1).map((x) => { const q = x.queues.find((y) => y.name === n); return q ? q.pending : null; }));
  if (last && last.other.count) { names.push(`${last.other.count} other queues`); backlog.push(s.slice(1).map((x) => x.other.pending)); }
  return { xs, rates: [push, pop, ack], fired: [fired], lag: [p50, p99], dlq: [dlq], backlog, names };
}

const CHARTS = [
  ["rates", "Messages per second (broker)", () => ["pushed/s", "popped/s", "acked/s"], (v) => v.toFixed(1)],
  ["fired", "Timers fired per second (broker)", () => ["fired/s"], (v) => v.toFixed(1)],
  ["lag", "Timer fire lag, 1-min window (broker)", () => ["p50", "p99"], (v) => ms(v)],
  ["backlog", "Backlog per queue: pending behind the slowest group (your tenant)", (d) => d.names, (v) => num(Math.round(v))],
  ["dlq", "Dead letters stored (your tenant)", () => ["dead letters"], (v) => num(Math.round(v))],
];

function drawChart(id, title, labels, unit, data) {
  const el = document.getElementById(`chart-${id}`);
  if (!el) return;
  const series = id === "backlog" ? data.backlog : data[id];
  const rows = [data.xs].concat(series);
  const key = labels.join("\u0000");
  let u = state.charts[id];
  if (u && (u.queenKey !== key || !el.contains(u.root))) { u.destroy(); delete state.charts[id]; u = null; }
  if (!u) {
    if (!labels.length) { el.innerHTML = `<p class="muted">${esc(title)}: no queues yet</p>`; el.dataset.points = "0"; return; }
    el.innerHTML = "";
    u = new uPlot(chartOpts(id, title, labels, unit), rows, el);
    u.queenKey = key;
    state.charts[id] = u;
  } else {
    u.setData(rows);
  }
  // what a test (or a curious operator) reads: how many points, which series ever left zero
  el.dataset.points = String(data.xs.length);
  el.dataset.moved = labels.filter((_, i) => (series[i] || []).some((v) => v > 0)).join(",");
}

function renderLive() {
  const stats = document.getElementById("live-stats");
  if (!stats) return;
  if (state.liveError) { stats.innerHTML = errorHtml(state.liveError, "live figures"); return; }
  const s = state.samples, n = s.length;
  if (n < 2) { stats.innerHTML = `<span class="muted">sampling every ${SAMPLE_MS / 1000} s… (two samples are needed)</span>`; }
  else {
    const a = s[n - 2], b = s[n - 1], base = s.find((x) => x.t >= b.t - 60_000) || s[0];
    stats.innerHTML =
      `<span class="stat">pushed/s<b id="live-push">${rate(a, b, "pushed").toFixed(1)}</b></span>` +
      `<span class="stat">popped/s<b id="live-pop">${rate(a, b, "popped").toFixed(1)}</b></span>` +
      `<span class="stat">acked/s<b id="live-ack">${rate(a, b, "acked").toFixed(1)}</b></span>` +
      `<span class="stat">timers fired/s<b id="live-fired">${rate(a, b, "timersFired").toFixed(1)}</b></span>` +
      `<span class="stat">fire lag p99 (1 min)<b id="live-p99">${ms(base === b ? null : quantile(0.99, base, b))}</b></span>` +
      `<span class="stat">backlog (tenant)<b id="live-backlog">${num(b.backlog)}</b></span>` +
      `<span class="stat">dead letters (tenant)<b id="live-dlq">${num(b.deadLetters)}</b>` +
      `<span class="muted">${b.deadLetters - base.deadLetters >= 0 ? "+" : ""}${num(b.deadLetters - base.deadLetters)} in the last minute</span></span>`;
  }
  if (typeof uPlot === "undefined") {
    document.getElementById("live-grid").innerHTML = `<div class="error">the charting library did not load (/console/vendor/uplot/uPlot.iife.min.js)</div>`;
    return;
  }
  const data = liveData();
  for (const [id, title, labels, unit] of CHARTS) drawChart(id, title, labels(data), unit, data);
}

async function viewLive() {
  for (const id of Object.keys(state.charts)) { state.charts[id].destroy(); delete state.charts[id]; }
  view.innerHTML = `<h2>Live <span class="muted">(the last ${KEEP_MS / 60000} minutes while this tab is open, sampled every ${SAMPLE_MS / 1000} s)</span></h2>
    <div class="panel" id="live-stats"></div>
    <div id="live-grid" class="charts">${CHARTS.map(([id]) => `<div class="panel chart" id="chart-${id}" data-points="0"></div>`).join("")}</div>
    <p class="muted">Broker figures count every tenant and worker (the counters of /metrics); tenant figures are your token's.</p>`;
  renderLive();
}

// ---------------------------------------------------------------- DLQ

async function viewDlq(arg) {
  if (arg) state.dlqFilters = { queue: arg };
  const f = state.dlqFilters;
  view.innerHTML = `<h2>Dead letters</h2>
    <form class="filters" id="dlq-form">
      <input name="queue" placeholder="queue" value="${esc(f.queue || "")}">
      <input name="consumerGroup" placeholder="consumer group" value="${esc(f.consumerGroup || "")}">
      <input name="partition" placeholder="partition" value="${esc(f.partition || "")}">
      <input name="from" placeholder="from (ISO time)" value="${esc(f.from || "")}">
      <input name="to" placeholder="to (ISO time)" value="${esc(f.to || "")}">
      <button type="submit">Filter</button></form>
    <div id="dlq-result"></div><div id="dlq-list">Loading…</div><div id="dlq-message"></div>`;
  document.getElementById("dlq-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const fd = new FormData(ev.target);
    state.dlqFilters = Object.fromEntries([...fd.entries()].filter(([, v]) => String(v).trim()).map(([k, v]) => [k, String(v).trim()]));
    state.dlqOffset = 0;
    loadDlq();
  });
  loadDlq();
}

async function loadDlq() {
  const el = document.getElementById("dlq-list");
  const params = new URLSearchParams({ ...state.dlqFilters, limit: "25", offset: String(state.dlqOffset) });
  try {
    const d = await api("GET", `/api/v1/dlq?${params}`);
    state.dlqRows = d.messages;
    el.innerHTML = `<p>${num(d.total)} dead letters match; showing ${num(d.offset + (d.messages.length ? 1 : 0))}–${num(d.offset + d.messages.length)}.</p>` + table([
      { label: "moved to DLQ", html: (m) => ago(m.movedToDlqAt) },
      { label: "queue", html: (m) => esc(m.queueName) },
      { label: "partition", html: (m) => esc(m.partitionName) },
      { label: "consumer group", html: (m) => (m.synthetic ? `${esc(m.consumerGroup)} <span class="muted">(timer)</span>` : esc(m.consumerGroup)) },
      { label: "retries", num: true, html: (m) => num(m.retryCount) },
      { label: "error", html: (m) => fmt(m.errorMessage) },
      { label: "", html: (m) => `<button data-show="${esc(m.id)}">View</button> <button data-replay="${esc(m.id)}">Replay</button>` },
    ], d.messages, { id: "dlq-table", empty: "no dead letters match" }) +
      `<button id="dlq-prev" ${d.offset > 0 ? "" : "disabled"}>Previous</button> <button id="dlq-next" ${d.offset + d.messages.length < d.total ? "" : "disabled"}>Next</button>`;
    el.querySelectorAll("[data-show]").forEach((b) => b.addEventListener("click", () => showDlq(b.dataset.show)));
    el.querySelectorAll("[data-replay]").forEach((b) => b.addEventListener("click", () => replayDlq(b.dataset.replay)));
    document.getElementById("dlq-prev").addEventListener("click", () => { state.dlqOffset = Math.max(0, state.dlqOffset - 25); loadDlq(); });
    document.getElementById("dlq-next").addEventListener("click", () => { state.dlqOffset += 25; loadDlq(); });
  } catch (e) { el.innerHTML = errorHtml(e, "dead letters"); }
}

function showDlq(id) {
  const m = (state.dlqRows || []).find((x) => x.id === id);
  document.getElementById("dlq-message").innerHTML = m
    ? `<h3>Dead letter <code>${esc(id)}</code></h3><pre id="dlq-json">${esc(JSON.stringify(m, null, 2))}</pre>` : "";
}

async function replayDlq(id) {
  const el = document.getElementById("dlq-result");
  try {
    const r = await api("POST", `/api/v1/dlq/${enc(id)}/replay`);
    el.innerHTML = `<div class="ok" id="replay-result">Replayed into <code>${esc(r.queue)}</code> / <code>${esc(r.partition)}</code> as message <code>${esc(r.messageId)}</code> (transaction <code>${esc(r.transactionId)}</code>).</div>`;
    loadDlq();
  } catch (e) { el.innerHTML = errorHtml(e, "replay refused"); }
}

// ---------------------------------------------------------------- tenants and usage

const LIMITS = [
  ["periodQuotaMessages", "messages per period", "messages"],
  ["storageQuotaBytes", "stored bytes", "storageBytes"],
  ["timersRowQuota", "pending timers", "timersPending"],
  ["rateLimitPerS", "operations per second", null],
  ["maxPayloadBytes", "largest payload (bytes)", null],
  ["timersHorizonMs", "longest timer delay (ms)", null],
];

function limitsTable(plan, usage, id) {
  return table([
    { label: "limit", html: (l) => esc(l[1]) },
    { label: "effective", num: true, html: (l) => (plan[l[0]] === 0 && l[0] !== "maxPayloadBytes" ? "unlimited" : num(plan[l[0]])) },
    { label: "used this period", num: true, html: (l) => (l[2] && usage ? num(usage[l[2]]) : "") },
    { label: "rung", html: (l) => {
      if (!l[2] || !usage || !plan[l[0]]) return "";
      const used = Number(usage[l[2]]), lim = Number(plan[l[0]]);
      return used >= lim ? `<span class="on">reached: refused</span>` : `<span class="off">${((used / lim) * 100).toFixed(1)} %</span>`;
    } },
  ], LIMITS, { id });
}

async function viewTenants() {
  view.innerHTML = `<h2>Your tenant</h2><div id="own-usage">Loading…</div>
    <h2>Cluster switches <span class="muted">(admin)</span></h2><div id="switches">Loading…</div>
    <h2>All tenants <span class="muted">(admin)</span></h2><div id="all-tenants">Loading…</div><div id="tenant-plan"></div>`;
  await Promise.all([
    section(document.getElementById("own-usage"), async () => {
      const u = await api("GET", "/api/v1/usage");
      return `<div class="panel"><span class="stat">tenant<b>${esc(u.tenant)}</b></span><span class="stat">messages<b>${num(u.messages)}</b></span>` +
        `<span class="stat">KV ops<b>${num(u.kvOps)}</b></span><span class="stat">stored bytes<b>${num(u.storageBytes)}</b></span>` +
        `<span class="stat">pending timers<b>${num(u.timersPending)}</b></span><div class="muted">period ${esc(u.periodStart)} → ${esc(u.periodEnd)}</div></div>` +
        limitsTable(u.plan || {}, u, "own-limits");
    }, "usage"),
    section(document.getElementById("switches"), async () => {
      const [susp, kv, sw] = await Promise.all([
        api("GET", "/api/v1/admin/cluster/suspended"), api("GET", "/api/v1/admin/kv"), api("GET", "/api/v1/admin/timers/sweeper")]);
      const flag = (on, txt) => (on ? `<span class="on">${txt}</span>` : `<span class="off">no</span>`);
      return table([{ label: "switch", html: (r) => esc(r[0]) }, { label: "in force", html: (r) => r[1] }], [
        ["cluster suspended (every produce call 403 cluster_suspended)", flag(susp.suspended, "SUSPENDED")],
        ["timer scheduling switched off (503 timers_disabled)", flag(!sw.schedulingEnabled, "OFF")],
        ["sweeper paused (no timer fires)", flag(sw.paused, "PAUSED")],
        ["KV switched off (503 kv_disabled)", flag(!kv.enabled, "OFF")],
      ], { id: "switches-table" });
    }, "cluster switches"),
    section(document.getElementById("all-tenants"), async () => {
      const a = await api("GET", "/api/v1/admin/usage");
      setTimeout(() => document.querySelectorAll("[data-tenant]").forEach((b) => b.addEventListener("click", () => loadPlan(b.dataset.tenant))), 0);
      return `<p class="muted">period ${esc(a.periodStart)} → ${esc(a.periodEnd)}</p>` + table([
        { label: "tenant", html: (t) => `<button data-tenant="${esc(t.tenant)}">${esc(t.tenant)}</button>` },
        { label: "messages", num: true, html: (t) => num(t.messages) },
        { label: "KV ops", num: true, html: (t) => num(t.kvOps) },
        { label: "stored bytes", num: true, html: (t) => num(t.storageBytes) },
        { label: "pending timers", num: true, html: (t) => num(t.timersPending) },
      ], a.tenants, { id: "tenants-table", empty: "no tenant has used anything this period" });
    }, "all tenants"),
  ]);
}

async function loadPlan(tenant) {
  const el = document.getElementById("tenant-plan");
  await section(el, async () => {
    const [p, paused, usage] = await Promise.all([
      api("GET", `/api/v1/admin/tenants/${enc(tenant)}/plan`),
      api("GET", `/api/v1/admin/tenants/${enc(tenant)}/timers-paused`),
      api("GET", `/api/v1/admin/usage?tenant=${enc(tenant)}`)]);
    const u = (usage.tenants || [])[0] || null;
    return `<h3>Tenant <code>${esc(tenant)}</code></h3>` +
      `<p>Plan: ${p.plan ? "stored (narrows the cell)" : "none (the cell's values)"} · timer scheduling ${paused.paused ? '<span class="on">PAUSED by an operator</span>' : '<span class="off">allowed</span>'}</p>` +
      limitsTable(p.effective, u, "plan-limits") + `<h3>Stored plan / cell</h3><pre>${esc(JSON.stringify({ plan: p.plan, cell: p.cell }, null, 2))}</pre>`;
  }, `tenant ${tenant}`);
}

// ---------------------------------------------------------------- routing

const VIEWS = { live: viewLive, queues: viewQueues, timers: viewTimers, dlq: viewDlq, tenants: viewTenants };

async function route() {
  clearFlash();
  const hash = location.hash.replace(/^#/, "") || "queues";
  const [name, ...rest] = hash.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  const fn = VIEWS[name] || viewQueues;
  state.view = VIEWS[name] ? name : "queues";
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === state.view));
  document.body.dataset.view = state.view;
  try { await fn(arg); } catch (e) { view.innerHTML = errorHtml(e, state.view); }
  document.body.dataset.loaded = hash;
}

document.getElementById("auth").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const t = document.getElementById("token").value.trim().replace(/^bearer\s+/i, "");
  if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token").value = "";
  state.samples.length = 0;  // another credential, maybe another tenant: its figures start afresh
  const w = await whoami();
  await route();
  if (!w) showFlash(`<div class="error">This token was refused; see the message on the right.</div>`);
});
document.getElementById("forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); state.samples.length = 0; whoami(); route(); });
window.addEventListener("hashchange", route);
whoami().then(route);
startSampler();
window.queenCharts = state.charts;  // the live charts' uPlot instances, for tests and the curious
