// The Hoist web view: one page fed by server-sent events (/events).  Everything shown is built
// with DOM nodes and textContent, never innerHTML: session owners, commands, image names and
// status_info are user input.
"use strict";

const S = { sections: {}, progress: new Map(), rates: new Map(), who: "", admin: false };
const RATE_WINDOW_MS = 3000;
const STATUSES = ["PENDING", "SCHEDULED", "PREPARING", "PULLING", "PREPARED", "CREATING", "RUNNING",
  "TERMINATING", "TERMINATED", "ERROR", "CANCELLED"];
let hist = { sid: null, rows: [], lastSeq: 0, loading: false, error: null };
let logs = { sid: null, text: null, error: null };
let destroyResult = { sid: null, text: "" };
const filters = { status: "", owner: "", group: "", label: "" };
let dirty = false;

// -- helpers -------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function amount(n) { return String(Number(n.toFixed(3))); } // a slot's units, to the scheduler's 1/1000

function eta(seconds) {
  if (seconds === null || !isFinite(seconds)) return "-:--:--";
  const s = Math.round(seconds);
  const pad = (x) => String(x).padStart(2, "0");
  return `${Math.floor(s / 3600)}:${pad(Math.floor((s % 3600) / 60))}:${pad(s % 60)}`;
}

function bar(fraction, label, kind) {
  const inner = el("span");
  inner.style.width = `${Math.max(0, Math.min(1, fraction || 0)) * 100}%`;
  return el("div", { class: `bar ${kind || ""}`, role: "progressbar",
    "aria-valuenow": Math.round((fraction || 0) * 100) }, inner, el("em", {}, label || ""));
}

function status(s) { return el("span", { class: `status s-${s}` }, s || "?"); }
function rows(name) { const v = S.sections[name]; return (v && v.rows) || []; }
// What stands in for a section the manager refused (an error) or serves only admins (a plain
// Hoist user's view: the hub does not ask it); null when it has rows.
function sectionNote(name) {
  const v = S.sections[name];
  if (v && v.admin_only) return el("p", { class: "dim admin-only", "data-admin-only": name }, v.admin_only);
  if (v && v.error) return el("p", { class: "error" }, v.error);
  return null;
}
function short(id) { return (id || "").slice(0, 12); }
function when(t) { return t ? String(t).replace("T", " ").slice(0, 19) : "-"; }

function sample(key, value) {
  const now = performance.now();
  let list = S.rates.get(key);
  if (!list) { list = []; S.rates.set(key, list); }
  if (list.length && list[list.length - 1][1] === value) return;
  list.push([now, value]);
  while (list.length > 2 && now - list[0][0] > RATE_WINDOW_MS) list.shift();
}

function rate(key) {
  const list = S.rates.get(key);
  if (!list || list.length < 2) return null;
  const [t0, v0] = list[0];
  const [, v1] = list[list.length - 1];
  return (v1 - v0) / Math.max((performance.now() - t0) / 1000, 1e-3);
}

function rateText(key, current, total) {
  const r = rate(key);
  if (r === null || current >= total) return "";
  return `${bytes(r)}/s  ETA ${eta(r > 0 ? (total - current) / r : null)}`;
}

// -- the stream ----------------------------------------------------------------------------------

function applyProgress(list) {
  for (const p of list) {
    S.progress.set(p.key, p);
    sample(p.key, p.current);
    for (const layer of p.layers || []) sample(`${p.key}/${layer.id}`, layer.current);
  }
}

function connect() {
  const source = new EventSource("/events");
  source.onopen = () => { document.getElementById("link").textContent = "live"; };
  source.onerror = () => { document.getElementById("link").textContent = "reconnecting…"; };
  source.onmessage = (e) => {
    const msg = JSON.parse(e.data);
    if (msg.kind === "snapshot") {
      S.sections = msg.sections; S.who = msg.who; S.admin = msg.admin;
      S.progress.clear(); applyProgress(msg.progress);
      document.getElementById("who").textContent = `as ${msg.who}${msg.admin ? " (admin)" : ""}`;
    } else if (msg.kind === "who") { // the manager promoted or demoted this Hoist user
      S.who = msg.who; S.admin = msg.admin;
      document.getElementById("who").textContent = `as ${msg.who}${msg.admin ? " (admin)" : ""}`;
    } else if (msg.kind === "sections") {
      Object.assign(S.sections, msg.sections);
      if (msg.sections.sessions && hist.sid) loadHistory(hist.sid);
    } else if (msg.kind === "progress") {
      applyProgress(msg.progress);
    } else if (msg.kind === "ended") { // the user was disabled: no reconnecting, no stale "live"
      source.close();
      document.getElementById("link").textContent = `signed out: ${msg.reason}`;
      document.getElementById("main").classList.add("ended");
    }
    schedule();
  };
}

function schedule() {
  if (dirty) return;
  dirty = true;
  requestAnimationFrame(() => { dirty = false; render(); });
}

// -- pulls ---------------------------------------------------------------------------------------

function pullOf(kernel) {
  return kernel.agent_id && kernel.pull_task_id ? S.progress.get(`${kernel.agent_id}/${kernel.pull_task_id}`) : null;
}

function pullSize(p) {
  const sized = (p.layers || []).filter((l) => l.total).map((l) => l.total);
  const unsized = (p.layers || []).length - sized.length;
  const sum = sized.reduce((a, b) => a + b, 0);
  return Math.max(p.total, sum + (sized.length ? Math.floor(unsized * sum / sized.length) : 0));
}

function pullView(p, withLayers) {
  const total = pullSize(p);
  const failed = p.done && p.error;
  const fraction = p.done && !failed ? 1 : total ? Math.min(p.current / total, 0.99) : 0;
  const kind = failed ? "failed" : p.done ? "done" : "";
  const label = failed ? `failed: ${p.error}` : `${(fraction * 100).toFixed(1)} %  ${bytes(p.current)} / ${bytes(total)}  ${rateText(p.key, p.current, total)}`;
  const parts = [el("div", { class: "pull", "data-pull": p.key }, bar(fraction, label, kind))];
  if (withLayers && !p.done) {
    parts.push(el("div", { class: "layers" }, (p.layers || []).map((l) =>
      el("div", { class: "row" }, el("span", { class: "mono dim" }, short(l.id)),
        bar(l.total ? l.current / l.total : 0, `${bytes(l.current)} / ${bytes(l.total)}  ${rateText(`${p.key}/${l.id}`, l.current, l.total)}`),
        el("span", { class: "dim" }, l.status)))));
  }
  return parts;
}

function sessionPull(kernels) {
  const seen = new Map();
  for (const k of kernels) {
    const p = pullOf(k);
    if (p) seen.set(p.key, p);
  }
  if (!seen.size) return null;
  let current = 0, total = 0, finished = true, failed = null;
  for (const p of seen.values()) {
    current += p.current; total += pullSize(p); finished = finished && p.done;
    if (p.done && p.error) failed = p.error;
  }
  const key = `session/${[...seen.keys()].sort().join(",")}`;
  sample(key, current);
  const fraction = finished && !failed ? 1 : total ? Math.min(current / total, 0.99) : 0;
  const label = failed ? `pull failed: ${failed}` : `all agents ${(fraction * 100).toFixed(1)} %  ${bytes(current)} / ${bytes(total)}  ${rateText(key, current, total)}`;
  return el("div", { class: "session-pull" }, bar(fraction, label, failed ? "failed" : finished ? "done" : ""));
}

// -- the dashboard -------------------------------------------------------------------------------

function fleet() {
  const images = new Map();
  for (const i of rows("images")) {
    if (!images.has(i.agent_id)) images.set(i.agent_id, []);
    images.get(i.agent_id).push(i);
  }
  const cards = rows("agents").map((a) => {
    const usedCpu = a.cpu - a.free_cpu, usedMem = a.mem - a.free_mem;
    const held = images.get(a.agent_id) || [];
    return el("div", { class: `card ${a.alive ? "" : "lost"}`, "data-agent": a.agent_id },
      el("h3", {}, a.agent_id, " ", el("span", { class: a.alive ? "s-RUNNING" : "s-ERROR" }, a.alive ? "alive" : "lost"),
        el("span", { class: "dim" }, `  ${a.resource_group} · ${a.runtime} · ${a.kernels} kernel(s)`)),
      a.alive ? null : el("div", { class: "error" }, a.status_info),
      el("div", { class: "row" }, el("span", { class: "label" }, "cpu"), bar(a.cpu ? usedCpu / a.cpu : 0, `${usedCpu.toFixed(2)} / ${a.cpu} used`, "used"), `${a.free_cpu} free`),
      el("div", { class: "row" }, el("span", { class: "label" }, "mem"), bar(a.mem ? usedMem / a.mem : 0, `${bytes(usedMem)} / ${bytes(a.mem)} used`, "used"), `${bytes(a.free_mem)} free`),
      el("div", { class: "row" }, el("span", { class: "label" }, "disk"), bar(a.disk ? (a.disk - a.free_disk) / a.disk : 0, `${bytes(a.disk - a.free_disk)} / ${bytes(a.disk)}`, "used"), `${bytes(a.free_disk)} free`),
      Object.entries(a.slot_amounts || {}).sort().map(([slot, cap]) => {
        const free = (a.free_slots || {})[slot] ?? cap, used = cap - free;
        return el("div", { class: "row", "data-slot": slot }, el("span", { class: "label" }, slot), bar(cap ? used / cap : 0, `${amount(used)} / ${amount(cap)} used`, "used"), `${amount(free)} free`);
      }),
      el("table", { class: "images" }, held.map((i) => el("tr", { "data-image": i.image },
        el("td", { class: "mono" }, i.image, i.preloaded ? el("span", { class: "mark" }, "preloaded") : null,
          i.pinned ? el("span", { class: "mark pin" }, "pinned") : null),
        el("td", {}, bytes(i.size_bytes)),
        el("td", { class: "dim using" }, i.kernels_using ? `${i.kernels_using} using` : "")))));
  });
  return el("section", { id: "fleet" }, el("h2", {}, "Fleet"), sectionNote("agents"), sectionNote("images"),
    el("div", { class: "grid" }, cards));
}

function select(name, values) {
  const s = el("select", { "data-filter": name, onchange: (e) => { filters[name] = e.target.value; render(); } },
    el("option", { value: "" }, `any ${name}`), [...values].sort().map((v) => el("option", { value: v }, v)));
  s.value = filters[name];
  return s;
}

function kernelsBySession() {
  const by = new Map();
  for (const k of rows("kernels")) {
    if (!by.has(k.session_id)) by.set(k.session_id, []);
    by.get(k.session_id).push(k);
  }
  return by;
}

// A session's labels as `key=value` texts (the read model's map; none on older sessions).
function labelsOf(s) {
  return Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).sort();
}

function sessions() {
  const all = rows("sessions");
  const kernels = kernelsBySession();
  const shown = all.filter((s) => (!filters.status || s.status === filters.status)
    && (!filters.owner || s.owner === filters.owner) && (!filters.group || s.resource_group === filters.group)
    && (!filters.label || labelsOf(s).includes(filters.label)));
  shown.sort((a, b) => String(b.created_at).localeCompare(String(a.created_at)));
  // The filters are a block of their own: redrawn only when their choices change, so an open
  // drop-down stays open while the table under it moves.
  const bar = el("section", { id: "session-filters", class: "filters" }, el("h2", {}, "Sessions"),
    select("status", new Set(STATUSES)),
    select("owner", new Set(all.map((s) => s.owner))), select("group", new Set(all.map((s) => s.resource_group))),
    select("label", new Set(all.flatMap(labelsOf))));
  return [bar, el("section", { id: "sessions" }, el("p", { class: "dim" }, `${shown.length} of ${all.length} shown`),
    el("table", {}, el("tr", {}, ["session", "owner", "image", "group", "kernels", "status", "status_info", "pull", "created"].map((h) => el("th", {}, h))),
      shown.map((s) => {
        const ks = kernels.get(s.session_id) || [];
        return el("tr", { "data-session": s.session_id },
          el("td", { class: "mono" }, el("a", { href: `#/session/${encodeURIComponent(s.session_id)}` }, s.name || short(s.session_id)),
            labelsOf(s).length ? el("div", { class: "dim", "data-labels": "" }, labelsOf(s).join(" ")) : null),
          el("td", { class: "owner" }, s.owner), el("td", { class: "mono" }, s.image), el("td", {}, s.resource_group),
          el("td", {}, ks.map((k) => el("div", {}, status(k.status), " ", el("span", { class: "dim" }, k.agent_id || "-")))),
          el("td", {}, status(s.status)), el("td", { class: "dim" }, s.status_info),
          el("td", {}, s.status === "PULLING" ? sessionPull(ks) : ""), el("td", { class: "dim" }, when(s.created_at)));
      })))];
}

function livePulls() {
  const active = [...S.progress.values()].filter((p) => !p.done);
  return el("section", { id: "live-pulls" }, el("h2", {}, `Pulls in progress (${active.length})`),
    active.map((p) => el("div", {}, el("h3", { class: "mono" }, p.image, el("span", { class: "dim" }, `  on ${p.agent_id}`)), pullView(p, true))));
}

function occupancy() {
  const pulling = { owner: new Map(), agent: new Map() };
  for (const k of rows("kernels")) {
    if (k.status !== "PULLING") continue;
    for (const [by, key] of [["owner", k.owner], ["agent", k.agent_id]]) {
      const v = pulling[by].get(key) || { kernels: 0, cpu: 0, mem: 0 };
      v.kernels++; v.cpu += k.cpu; v.mem += k.mem;
      pulling[by].set(key, v);
    }
  }
  const table = (name, by, col) => {
    if (sectionNote(name)) return sectionNote(name);
    const keys = new Set([...rows(name).map((r) => r[col]), ...pulling[by].keys()]);
    const charged = new Map(rows(name).map((r) => [r[col], r]));
    return el("table", { "data-occupancy": by }, el("tr", {}, [by, "kernels", "cpu", "mem", by === "owner" ? "PULLING (not charged)" : "of which PULLING"].map((h) => el("th", {}, h))),
      [...keys].sort().map((key) => {
        const c = charged.get(key) || { kernels: 0, cpu: 0, mem: 0 };
        const p = pulling[by].get(key);
        return el("tr", { "data-key": key }, el("td", {}, key), el("td", {}, c.kernels), el("td", {}, Number(c.cpu).toFixed(2)), el("td", {}, bytes(c.mem)),
          el("td", { class: "dim" }, p ? `${p.kernels} kernel(s), ${p.cpu.toFixed(2)} cpu, ${bytes(p.mem)}` : ""));
      }));
  };
  return el("section", { id: "occupancy" }, el("h2", {}, "Occupancy"),
    el("h3", {}, "by owner (charged to the quota; PULLING kernels are not: shown apart)"), table("occupancy_owner", "owner", "owner"),
    el("h3", {}, "by agent (PULLING kernels hold the agent's room: included, and shown)"), table("occupancy_agent", "agent", "agent_id"));
}

function pullsTable() {
  const list = rows("pulls").slice().sort((a, b) => String(b.started_at).localeCompare(String(a.started_at))).slice(0, 50);
  return el("section", { id: "pulls" }, el("h2", {}, "Pulls"), sectionNote("pulls"),
    el("table", {}, el("tr", {}, ["agent", "image", "outcome", "reason", "bytes", "duration", "started"].map((h) => el("th", {}, h))),
      list.map((p) => el("tr", { "data-task": p.task_id }, el("td", {}, p.agent_id), el("td", { class: "mono" }, p.image), el("td", {}, p.outcome),
        el("td", { class: "dim" }, p.reason || ""), el("td", {}, bytes(p.bytes)),
        el("td", {}, p.duration_s !== null && p.duration_s !== undefined ? `${Number(p.duration_s).toFixed(1)} s` : ""), el("td", { class: "dim" }, when(p.started_at))))));
}

function policies() {
  const plans = S.sections.plans;
  const planRows = plans && plans.plans ? Object.entries(plans.plans) : [];
  return el("section", { id: "policies" }, el("h2", {}, "Prepull policies"),
    sectionNote("policies"),
    el("table", {}, el("tr", {}, ["name", "images", "resource groups", "removed"].map((h) => el("th", {}, h))),
      rows("policies").map((p) => el("tr", { "data-policy": p.name }, el("td", {}, p.name), el("td", { class: "mono" }, JSON.stringify(p.rules ?? p.images ?? "")),
        el("td", {}, JSON.stringify(p.resource_groups ?? "")), el("td", {}, p.removed ? "yes" : "")))),
    el("h3", {}, `each agent's plan${plans && plans.converged ? " (converged)" : ""}`), sectionNote("plans"),
    el("table", {}, el("tr", {}, ["agent", "desired", "to pull", "skipped", "budget"].map((h) => el("th", {}, h))),
      planRows.map(([agent, plan]) => el("tr", { "data-plan": agent }, el("td", {}, agent),
        el("td", { class: "mono" }, (plan.desired || []).map((w) => el("div", {}, `${w.image} (${bytes(w.size_bytes)}, ${w.policy})`))),
        el("td", { class: "mono" }, (plan.to_pull || []).join(", ")),
        el("td", { class: "dim" }, (plan.skipped || []).map((s) => el("div", {}, `${s.image}: ${s.why}`))),
        el("td", {}, `${bytes(plan.bytes)} / ${bytes(plan.budget)}`)))));
}

// -- a session's page ----------------------------------------------------------------------------

async function loadHistory(sid) {
  if (hist.sid !== sid) hist = { sid, rows: [], lastSeq: 0, loading: false, error: null };
  if (hist.loading) return;
  hist.loading = true;
  try {
    const r = await fetch(`/api/sessions/${encodeURIComponent(sid)}/history?after=${hist.lastSeq}`);
    const body = await r.json();
    if (hist.sid !== sid) return;
    if (body.error) hist.error = body.error;
    for (const e of body.events || []) { hist.rows.push(e); hist.lastSeq = Math.max(hist.lastSeq, e.seq); }
  } catch (e) {
    hist.error = String(e);
  } finally {
    hist.loading = false;
    schedule();
  }
}

async function loadLogs(sid) {
  logs = { sid, text: "loading…", error: null };
  render();
  const r = await fetch(`/api/sessions/${encodeURIComponent(sid)}/logs`);
  const body = await r.json();
  logs = { sid, text: body.logs ?? null, error: body.error ?? null };
  render();
}

async function destroy(sid, button) {
  button.disabled = true;
  const r = await fetch(`/api/sessions/${encodeURIComponent(sid)}/destroy`, { method: "POST", headers: { "X-Hoist-Request": "destroy" } });
  const body = await r.json();
  destroyResult = { sid, text: r.ok ? `destroy asked: ${body.status} ${body.status_info || ""}` : `refused: ${body.error}` };
  button.disabled = false;
  render();
}

function sessionPage(sid) {
  if (hist.sid !== sid) loadHistory(sid);
  const s = rows("sessions").find((x) => x.session_id === sid);
  const ks = (kernelsBySession().get(sid) || []).slice().sort((a, b) => a.kernel_index - b.kernel_index);
  const mayDestroy = S.admin || (s && s.owner === S.who);
  const ended = s && ["TERMINATED", "CANCELLED", "ERROR"].includes(s.status);
  return el("div", { id: "session-page", "data-session": sid },
    el("p", {}, el("a", { href: "#/" }, "← all sessions")),
    el("section", { id: "session-head" }, el("h2", { class: "mono" }, `session ${sid}`),
      s ? el("p", {}, "owner ", el("span", { class: "owner" }, s.owner), " · ", el("span", { class: "mono" }, s.image), " · ",
        status(s.status), " ", el("span", { class: "dim" }, s.status_info), s.command ? el("div", { class: "mono dim" }, `command: ${s.command}`) : null)
        : el("p", { class: "dim" }, "not among the sessions the view holds (yet)"),
      mayDestroy && s && !ended ? el("button", { class: "destroy", id: "destroy", onclick: (e) => destroy(sid, e.target) }, "Destroy") : null,
      el("span", { id: "destroy-result", class: "dim" }, destroyResult.sid === sid ? destroyResult.text : "")),
    el("section", { id: "session-kernels" }, el("h3", {}, "Kernels"), sessionPull(ks),
      el("table", {}, el("tr", {}, ["kernel", "host", "agent", "status", "status_info", "pull"].map((h) => el("th", {}, h))),
        ks.map((k) => {
          const p = pullOf(k);
          return el("tr", { "data-kernel": k.kernel_id }, el("td", { class: "mono" }, short(k.kernel_id)), el("td", {}, k.hostname || ""),
            el("td", {}, k.agent_id || "-"), el("td", {}, status(k.status)), el("td", { class: "dim" }, k.status_info, k.detail ? ` (${k.detail})` : ""),
            el("td", {}, p ? pullView(p, k.status === "PULLING") : ""));
        }))),
    el("section", {}, el("h2", {}, "Logs"), el("button", { id: "load-logs", onclick: () => loadLogs(sid) }, "show the main kernel's output"),
      logs.sid === sid && logs.error ? el("p", { class: "dim" }, logs.error) : null,
      logs.sid === sid && logs.text !== null ? el("pre", { id: "logs" }, logs.text) : null),
    el("section", {}, el("h2", {}, `Event history (${hist.rows.length})`), hist.error ? el("p", { class: "error" }, hist.error) : null,
      el("table", { id: "history" }, el("tr", {}, ["seq", "time", "type", "actor", "payload"].map((h) => el("th", {}, h))),
        hist.rows.map((e) => el("tr", {}, el("td", {}, e.seq), el("td", { class: "dim" }, when(e.time)), el("td", {}, e.type),
          el("td", {}, e.actor), el("td", { class: "mono" }, e.quarantined ? `QUARANTINED: ${e.quarantined}` : JSON.stringify(e.data)))))));
}

// -- routing -------------------------------------------------------------------------------------

function render() {
  const main = document.getElementById("main");
  const m = location.hash.match(/^#\/session\/([A-Za-z0-9_-]+)$/);
  const view = m ? sessionPage(m[1]) : el("div", { id: "dashboard" }, fleet(), livePulls(), sessions(), occupancy(), pullsTable(), policies());
  const old = main.firstElementChild;
  if (!old || old.id !== view.id || old.children.length !== view.children.length) {
    main.replaceChildren(view);
    return;
  }
  // Block by block: one that would be drawn the same is kept as it is (a button being clicked,
  // an open drop-down, a selection of text survive the redraws a live pull brings).
  [...view.children].forEach((fresh, i) => {
    const current = old.children[i];
    if (!current.isEqualNode(fresh)) current.replaceWith(fresh);
  });
}

window.addEventListener("hashchange", render);
setInterval(schedule, 1000); // rates fall while a pull stalls: redraw even without news
connect();
render();
