// Monitor: switch monitoring on and off for chosen features of an attached SAE (or its top K), and watch the
// running statistics (a bar chart of the top features by mean activation and the table GET
// /api/monitoring/stats answers) and the per-request history. The server pushes every change on
// GET /api/monitoring/events; the page asks for nothing while it is open. Below, the stored probes (attached ones
// watch every generation; attach or detach one here) and the sensing events (fired verdicts, sensing clusters
// whose members exceeded their thresholds: source and name in one column, a cluster's score the members over
// and its threshold min_members) the server pushes on GET /api/sensing/stream as they come.

import { del, get, post, put, seg, subscribe } from "../api.js";
import { bars, sparkline } from "../chart.js";
import { field, fill, h, num, section, table } from "../dom.js";
import { card, resolve } from "../features.js";

const TOP = 10; // bars in the chart unless the page's "top" box says otherwise
const DIGITS = 4;
const TREND_REQUESTS = 20; // recent requests the trend lines cover (the server sends this many)
const TREND_FEATURES = 3; // features drawn as trend lines (the top ones by mean)
const RETRY_MS = 2000; // a closed stream (the model unloaded, the server restarting) is opened again after this
const COLUMNS = ["feature", "label", "count", "mean", "std", "min", "max", "active fraction"];
const SENSED = 20; // sensing events the table shows (the newest first)

export async function render(root, ctx) {
  const enabled = h("input", { type: "checkbox", id: "mon-enabled" });
  const pick = h("select", { id: "mon-sae" });
  const features = h("input", { id: "mon-features", placeholder: "2375, weather, 17 (empty: the top K)", size: 34 });
  const summary = h("p", { id: "mon-summary", class: "muted" });
  const topK = h("input", { id: "mon-topk", type: "number", min: 1, max: 1024, step: 1, value: TOP, class: "layer" });
  const chart = h("div", { id: "mon-chart" });
  const stats = h("div", { id: "mon-table" });
  const history = h("div", { id: "mon-history" });
  const trends = h("div", { id: "mon-trends" });
  const labels = new Map();
  let last = null; // the newest pushed event: redrawn when the "top" box changes

  async function configure(on) {
    if (!on) return put("/api/monitoring", { enabled: false });
    const sae = pick.value;
    const indices = [];
    for (const name of features.value.split(",").map((t) => t.trim()).filter(Boolean)) {
      indices.push(await resolve(sae, name));
    }
    const chosen = indices.length ? { features: indices } : { top_k: Math.max(1, Number(topK.value) || TOP) };
    return put("/api/monitoring", { enabled: true, sae, ...chosen });
  }

  function label(sae, index) {
    const key = `${sae}:${index}`;
    if (!labels.has(key)) {
      labels.set(key, "");
      card(sae, index).then((c) => { labels.set(key, c.label || ""); if (last) draw(last); }).catch(() => {});
    }
    return labels.get(key);
  }

  function draw({ config, stats: now, recent }) {
    enabled.checked = config.enabled;
    const mode = config.top_k ? `, the top ${config.top_k} of every feature` : "";
    summary.textContent = `${config.enabled ? "Monitoring" : "Not monitoring"}${config.sae ? ` ${config.sae}` : ""}`
      + `${mode}: ${now.positions} positions read, ${now.requests_in_history} requests in the history.`;
    const rows = Object.entries(now.features).map(([index, f]) => ({ index, ...f }));
    rows.sort((a, b) => b.mean - a.mean);
    const top = rows.slice(0, Math.max(1, Number(topK.value) || TOP));
    fill(chart, rows.length ? bars(top.map((r) => ({ name: `${r.index} ${label(now.sae, r.index)}`.trim(),
                                                      value: r.mean })))
      : h("p", { class: "muted" }, "No features monitored."));
    fill(stats, table(COLUMNS, rows.map((r) => [r.index, label(now.sae, r.index), String(r.count),
      num(r.mean, DIGITS), num(r.std, DIGITS), num(r.min, DIGITS), num(r.max, DIGITS),
      num(r.active_fraction, DIGITS)]), { id: "mon-stats" }));
    const span = recent.slice(-TREND_REQUESTS);
    fill(trends, span.length ? table(["feature", "label", `mean per request (last ${span.length})`],
      top.slice(0, TREND_FEATURES).map((r) => {
        const series = span.map((q) => (q.features[r.index] ? q.features[r.index].mean : 0));
        return [r.index, label(now.sae, r.index), sparkline(series, { label: `feature ${r.index}` })];
      }), { id: "mon-trend-table" }) : h("p", { class: "muted" }, "No request recorded yet."));
    const latest = recent.slice(-10).reverse();
    fill(history, latest.length
      ? table(["time", "request", "positions", "top feature (mean)"], latest.map((r) => {
        const best = Object.entries(r.features).sort((a, b) => b[1].mean - a[1].mean)[0];
        return [new Date(r.time * 1000).toLocaleTimeString(), r.id, String(r.positions),
                best ? `${best[0]} (${num(best[1].mean, DIGITS)})` : "–"];
      }))
      : h("p", { class: "muted" }, "No request recorded yet."));
  }

  const probes = h("div", { id: "mon-probes" });
  const sensing = h("div", { id: "mon-sensing" });
  const sensed = []; // the newest sensing events, newest first
  let since = 0;

  async function drawProbes() {
    const listed = (await get("/api/probes")).data;
    fill(probes, listed.length ? table(["probe", "layer", "aggregation", "threshold", "held-out AUROC", "FPR",
      "model", "attached"], listed.map((p) => [p.name, String(p.layer), `${p.aggregation} over the ${p.span}`,
      num(p.threshold, DIGITS), num(p.figures.auroc, 3), num(p.figures.fpr, 3), p.model.id,
      h("button", { type: "button", class: "mon-probe-toggle", "data-probe": p.name, onclick: () => ctx.attempt(
        async () => { await post(`/api/probes/${seg(p.name)}/${p.attached ? "detach" : "attach"}`, {}); await drawProbes(); },
        p.attached ? `${p.name} detached.` : `${p.name} watches every generation.`) },
        p.attached ? `${p.attached.action}: detach` : "attach")]), { id: "mon-probe-table" })
      : h("p", { class: "muted" }, "No probe stored: learn one with `millm probes learn` or POST /api/probes/learn."));
  }

  function drawSensing() {
    fill(sensing, sensed.length ? table(["request", "time", "source", "choice", "score", "threshold", "position",
      "action"], sensed.map((e) => [e.request_id, new Date(e.time * 1000).toLocaleTimeString(), `${e.source} ${e.name}`,
      String(e.index), num(e.score, DIGITS), num(e.threshold, DIGITS), e.position === null ? "–" : String(e.position),
      e.action === null ? "–" : e.acted ? `${e.action} (acted)` : e.action]), { id: "mon-sensing-table" })
      : h("p", { class: "muted" }, "No sensing event yet: a probe's verdict that fires is one, and so is a sensing "
        + "cluster whose members exceed their thresholds."));
  }

  const stop = new AbortController();
  async function follow(path, name, take) {
    while (!stop.signal.aborted) {
      try {
        for await (const { event, data } of await subscribe(path(), stop.signal)) {
          if (event === name) take(JSON.parse(data));
        }
      } catch (err) {
        if (stop.signal.aborted) return;
        summary.textContent = `Not following ${name}: ${err.describe ? err.describe() : err.message}`;
      }
      await new Promise((done) => setTimeout(done, RETRY_MS));
    }
  }

  const attached = (await get("/api/saes")).data.filter((sae) => sae.attached_layer !== null);
  fill(pick, attached.map((sae) => h("option", { value: sae.id }, sae.id)));
  const config = await get("/api/monitoring").catch(() => null);
  if (config && config.sae) {
    pick.value = config.sae;
    features.value = config.features.join(", ");
    if (config.top_k) topK.value = config.top_k;
  }
  enabled.addEventListener("change", async () => {
    const done = await ctx.attempt(() => configure(enabled.checked),
      enabled.checked ? "Monitoring on." : "Monitoring off.");
    if (!done) enabled.checked = !enabled.checked;
  });
  topK.addEventListener("input", () => last && draw(last));

  root.append(
    section("Configuration",
      h("div", { class: "inline" }, h("label", { class: "toggle" }, enabled, " monitoring on"), field("SAE", pick),
        field("features", features),
        h("button", { type: "button", id: "mon-apply", onclick: () => ctx.attempt(() => configure(true),
          features.value.trim() ? "Monitoring these features." : "Monitoring the top features.") }, "Apply"),
        h("button", { type: "button", id: "mon-clear", onclick: () => ctx.attempt(
          () => del("/api/monitoring/history"), "History cleared (statistics stay).") }, "Clear history")),
      summary),
    section("Top features by mean activation", h("div", { class: "inline" }, field("top", topK)), chart),
    section("Running statistics", stats),
    section("Recent requests, top features", trends),
    section("Recent requests", history),
    section("Probes", probes),
    section("Sensing events", sensing));
  if (!attached.length) ctx.say("No SAE attached: attach one on the SAEs page to monitor its features.");
  drawSensing();
  await drawProbes().catch((err) => fill(probes, h("p", { class: "muted" }, `Probes: ${err.message}`)));
  follow(() => "/api/monitoring/events", "monitoring", (event) => { last = event; draw(last); });
  follow(() => `/api/sensing/stream?since=${since}`, "sensing", (event) => {
    since = event.id;
    sensed.unshift(event);
    sensed.splice(SENSED);
    drawSensing();
  });
  return () => stop.abort();
}
