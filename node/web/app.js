// The node's web view: polls /network, /status and /status/series once a second and draws
// them. Plain browser JavaScript, no library and no build step: the node serves this file.
"use strict";

const DOMAINS = ["messages", "members", "identity"];
const POLL_MS = 1000;
const WINDOW_MS = 5 * 60 * 1000; // the charts show the last five minutes
const TOKEN_KEY = "chatsync-admin-token";

const state = { samples: [], lastT: 0, token: sessionStorage.getItem(TOKEN_KEY) || "" };

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "onclick") node.onclick = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

async function getJson(path, options = {}) {
  const response = await fetch(path, options);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

function ago(ms) {
  if (ms === null || ms === undefined) return "never";
  if (ms < 1000) return "now";
  const s = ms / 1000;
  return s < 120 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(1)} min ago`;
}

// equal roots get equal colours, so agreement shows at a glance
function rootCell(hex, ours) {
  if (!hex) return el("td", { class: "muted" }, "unknown");
  const hue = parseInt(hex.slice(0, 4), 16) % 360;
  const span = el("span", { class: "root", title: hex, style: `background: hsl(${hue} 70% 88%)` },
    hex.slice(0, 10));
  if (ours && hex !== ours) span.style.outline = "2px solid #b42318";
  return el("td", {}, span);
}

function renderNetwork(net) {
  $("#self-id").textContent = net.peer_id;
  const rows = [];
  rows.push(el("tr", { class: "self", "data-peer": net.peer_id, "data-agrees": "true" },
    el("td", { class: "mono", title: net.peer_id }, "this node"), el("td", {}, "—"),
    ...DOMAINS.map((d) => rootCell(net.roots[d])),
    el("td", {}, "—"), el("td", {}, "—"), el("td", {}, "—"), el("td", { class: "admin-only" })));
  let agreeing = 0;
  const differing = [];
  for (const peer of net.peers) {
    if (peer.agrees) agreeing += 1;
    else differing.push(peer.peer_id.slice(-8));
    const link = peer.blocked ? "cut" : peer.connected ? "connected" : "not connected";
    const session = peer.last_session
      ? `${peer.last_session.result}, ${ago(peer.last_session.ms_ago)}` : "none";
    const roots = peer.roots || {};
    rows.push(el("tr", { "data-peer": peer.peer_id, "data-agrees": String(peer.agrees) },
      el("td", { class: "mono", title: peer.peer_id }, "…" + peer.peer_id.slice(-12)),
      el("td", { class: peer.blocked ? "no" : "" }, link),
      ...DOMAINS.map((d) => rootCell(roots[d], net.roots[d])),
      el("td", { class: peer.agrees ? "yes" : "no" }, peer.agrees ? "agrees" : "differs"),
      el("td", {}, ago(peer.agreed_ms_ago)), el("td", {}, session),
      el("td", { class: "admin-only" }, switchButton(peer))));
  }
  $("#network tbody").replaceChildren(...rows);
  const summary = $("#summary");
  const total = net.peers.length;
  if (total === 0) {
    summary.className = "summary";
    summary.textContent = "no peers yet";
  } else if (differing.length === 0) {
    summary.className = "summary ok";
    summary.textContent = `all ${total + 1} nodes agree: every root equal`;
  } else {
    summary.className = "summary bad";
    summary.textContent = `${agreeing + 1} of ${total + 1} nodes agree; ` +
      `differ: ${differing.map((p) => "…" + p).join(", ")}`;
  }
}

function switchButton(peer) {
  const action = peer.blocked ? "unblock" : "block";
  return el("button", { "data-action": action, onclick: () => adminSwitch(action, peer.peer_id) },
    peer.blocked ? "heal" : "cut");
}

async function adminSwitch(action, peerId) {
  try {
    await getJson(`/admin/${action}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${state.token}` },
      body: JSON.stringify({ peer_id: peerId }),
    });
    $("#token-state").textContent = `${action === "block" ? "cut" : "healed"} …${peerId.slice(-8)}`;
  } catch (err) {
    $("#token-state").textContent = `refused: ${err.message}`;
  }
}

function renderStatus(status) {
  const rows = DOMAINS.map((d) => el("tr", {}, el("td", {}, d),
    el("td", {}, String(status.domains[d].count)), rootCell(status.domains[d].root)));
  $("#domains tbody").replaceChildren(...rows);
  const w = status.writer;
  $("#writer").textContent = `writer: ${w.ops_new} new ops of ${w.ops_applied} applied in ` +
    `${w.batches} batches; queue ${w.queued} of ${w.capacity}. ` +
    `Listening on ${status.listen.join(", ")}`;
  const now = Date.now();
  const sessions = Object.entries(status.last_sync).sort((a, b) => b[1].started_ms - a[1].started_ms);
  $("#sessions tbody").replaceChildren(...sessions.map(([peer, o]) => el("tr", {},
    el("td", { class: "mono", title: peer }, "…" + peer.slice(-12)), el("td", {}, o.role),
    el("td", { class: o.error ? "no" : "" }, o.error || (o.converged ? "converged" : "not converged")),
    el("td", {}, ago(now - o.started_ms - o.duration_ms)), el("td", {}, o.duration_ms.toFixed(0)),
    el("td", {}, String(o.passes)),
    el("td", {}, `${o.records_received} / ${o.records_applied} / ${o.records_sent}`),
    el("td", {}, `${o.bytes_received} / ${o.bytes_sent}`))));
}

// per second, from consecutive samples' running totals
function rates(field) {
  const out = [];
  const s = state.samples;
  for (let i = 1; i < s.length; i++) {
    const dt = (s[i].t - s[i - 1].t) / 1000;
    out.push([s[i].t, dt > 0 ? Math.max(0, s[i][field] - s[i - 1][field]) / dt : 0]);
  }
  return out;
}

const points = (field, scale = 1) =>
  state.samples.filter((s) => s[field] !== null).map((s) => [s.t, s[field] * scale]);

function drawChart(id, lines) {
  const canvas = $(`#chart-${id}`);
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  const pad = { left: 48, right: 8, top: 8, bottom: 18 };
  const end = state.samples.length ? state.samples[state.samples.length - 1].t : Date.now();
  // the last five minutes, or all there is if the node is younger
  const first = state.samples.length ? state.samples[0].t : end;
  const start = Math.min(end - 10000, Math.max(end - WINDOW_MS, first));
  const span = end - start;
  const top = Math.max(1, ...lines.flatMap((l) => l.data.filter(([t]) => t >= start).map(([, v]) => v)));
  const x = (t) => pad.left + ((t - start) / span) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);
  g.strokeStyle = "#e5e7eb";
  g.fillStyle = "#6b7280";
  g.font = "11px system-ui";
  for (const f of [0, 0.5, 1]) {
    g.beginPath();
    g.moveTo(pad.left, y(top * f));
    g.lineTo(width - pad.right, y(top * f));
    g.stroke();
    g.fillText(formatValue(top * f), 4, y(top * f) + 4);
  }
  g.fillText(`−${(span / 1000).toFixed(0)} s`, pad.left, height - 4);
  g.fillText("now", width - pad.right - 22, height - 4);
  for (const line of lines) {
    g.strokeStyle = line.color;
    g.lineWidth = 1.5;
    g.beginPath();
    let first = true;
    for (const [t, v] of line.data) {
      if (t < start) continue;
      if (first) g.moveTo(x(t), y(v));
      else g.lineTo(x(t), y(v));
      first = false;
    }
    g.stroke();
  }
  $(`#legend-${id}`).replaceChildren(...lines.map((l) => {
    const last = l.data.length ? formatValue(l.data[l.data.length - 1][1]) : "–";
    return el("span", {}, el("i", { style: `background: ${l.color}` }), `${l.name} ${last}`);
  }));
}

function formatValue(v) {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

function renderCharts() {
  drawChart("ops", [
    { name: "API in", color: "#7c3aed", data: rates("api_in") },
    { name: "gossip in", color: "#16a34a", data: rates("gossip_in") },
    { name: "sync in", color: "#d97706", data: rates("sync_in") },
    { name: "written (new)", color: "#2563eb", data: rates("written") }, // on top: the sum
  ]);
  drawChart("lag", [
    { name: "p50", color: "#2563eb", data: points("lag_p50") },
    { name: "p99", color: "#dc2626", data: points("lag_p99") },
  ]);
  drawChart("mem", [{ name: "rss", color: "#0891b2", data: points("rss", 1 / 1048576) }]);
  drawChart("peers", [{ name: "connected", color: "#4b5563", data: points("peers") }]);
}

async function showLatency() {
  if (!state.token) {
    $("#latency").textContent = "";
    return;
  }
  const body = await getJson("/debug/latency", { headers: { authorization: `Bearer ${state.token}` } });
  const q = body.quantiles;
  $("#latency").textContent = q.count
    ? `gossip latency since start: p50 ${q.p50.toFixed(0)} ms, p99 ${q.p99.toFixed(0)} ms, ` +
      `max ${q.max.toFixed(0)} ms over ${q.count} ops`
    : "no gossip latency yet";
}

async function poll() {
  try {
    const [net, status, series] = await Promise.all([
      getJson("/network"), getJson("/status"), getJson(`/status/series?since=${state.lastT}`),
    ]);
    state.samples.push(...series.samples);
    if (state.samples.length) state.lastT = state.samples[state.samples.length - 1].t;
    state.samples = state.samples.filter((s) => s.t >= state.lastT - WINDOW_MS - POLL_MS);
    renderNetwork(net);
    renderStatus(status);
    renderCharts();
    $("#conn").textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("#conn").className = "muted";
  } catch (err) {
    $("#conn").textContent = `node not answering (${err.message}); retrying`;
    $("#conn").className = "no";
  }
  try {
    await showLatency();
  } catch (err) {
    $("#latency").textContent = `admin token refused (${err.message})`;
  }
  setTimeout(poll, POLL_MS);
}

function useToken(token) {
  state.token = token;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  document.body.classList.toggle("admin", Boolean(token));
  $("#token-state").textContent = token ? "token set (kept for this tab only)" : "";
}

document.addEventListener("DOMContentLoaded", () => {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    useToken($("#token").value.trim());
    $("#token").value = "";
  });
  $("#forget-token").addEventListener("click", () => useToken(""));
  useToken(state.token);
  poll();
});
