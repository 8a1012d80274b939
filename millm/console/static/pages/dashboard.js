// Dashboard: the loaded model (its dtype and context), the serving backend, attached SAEs, the steering now in
// force, and the server's own request and token rates and memory (from /metrics), refreshed every two seconds.

import { get, headers, read, request, seg } from "../api.js";
import { fill, h, num, section, table } from "../dom.js";
import { rates, totals } from "../metrics.js";

const COUNTERS = ["millm_prompt_tokens_total", "millm_completion_tokens_total", "process_resident_memory_bytes"];
const V1 = 'route="/v1/'; // requests counted: the OpenAI routes' (not the console's own reads)
const EVERY_MS = 2000;

function pairs(rows) {
  return h("dl", { class: "pairs" }, rows.map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
}

const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

/** The parts of a model identity, ``millm:<model>@<revision>:<dtype>/<quantization>:<engine>`` (the model's own
 * name may hold colons: the parts are read from the right). */
export function identity(fingerprint) {
  const parts = String(fingerprint || "").split(":");
  if (parts.length < 4) return { dtype: "–", quantization: "–" };
  const [dtype, quantization] = parts[parts.length - 2].split("/");
  return { dtype: dtype || "–", quantization: quantization || "–" };
}

/** [device, bytes] for each GPU the server reports memory on (none on the CPU). */
function devices(text) {
  return [...String(text).matchAll(/^millm_device_memory_bytes\{device="([^"]+)"\} (\S+)$/gm)]
    .map((m) => [m[1], Number(m[2])]);
}

async function metricsText() {
  const response = await fetch("/metrics", { headers: headers(false), cache: "no-store" });
  return read(response);
}

export async function render(root, ctx) {
  const model = h("div", { id: "dash-model" });
  const traffic = h("div", { id: "dash-traffic" });
  const saes = h("div", { id: "dash-saes" });
  const steer = h("div", { id: "dash-steering" });
  root.append(h("div", { class: "grid" },
    section("Model and backend", model), section("Traffic", traffic),
    section("Attached SAEs and vector sets", saes), section("Steering", steer)));
  let last = null;

  async function refresh() {
    const inference = await get("/api/health/inference");
    const [saeList, steering, circuit, text, entry] = await Promise.all([
      get("/api/saes"),
      request("GET", "/api/steering").catch((err) => ({ error: err })),
      get("/api/circuits/active").catch(() => null),
      metricsText().catch(() => ""),
      inference.model ? get(`/api/models/${seg(inference.model)}`).catch(() => null) : null,
    ]);
    const weights = identity(inference.fingerprint);
    fill(model, pairs([
      ["model", inference.model || "none loaded"],
      ["engine", inference.engine || "–"],
      ["weights", entry ? `${entry.source}${entry.quantization ? `, ${entry.quantization}` : ""}` : "–"],
      ["dtype", weights.dtype],
      ["context", inference.context_window ? `${inference.context_window} tokens` : "–"],
      ["state", inference.state || (inference.model ? "loaded" : "–")],
      ["backend", inference.backend],
      ["in flight", String(inference.in_flight)],
      ["queue", `${inference.queue_depth} of ${inference.max_queue}`],
    ]));
    const values = { ...totals(text, COUNTERS), ...totals(text, ["millm_requests_total"], V1) };
    const now = { at: performance.now(), values };
    const rate = last ? rates(last.values, now.values, (now.at - last.at) / 1000) : {};
    last = now;
    const rss = now.values.process_resident_memory_bytes;
    fill(traffic, pairs([
      ["/v1 requests", num(now.values.millm_requests_total, 0)],
      ["requests/s", num(rate.millm_requests_total, 2)],
      ["completion tokens", num(now.values.millm_completion_tokens_total, 0)],
      ["tokens/s", num(rate.millm_completion_tokens_total, 1)],
      ["memory (RSS)", rss ? mib(rss) : "not reported"],
      ...devices(text).map(([device, bytes]) => [`GPU memory (${device})`, mib(bytes)]),
    ]));
    const attached = saeList.data.filter((sae) => sae.attached_layer !== null);
    fill(saes, attached.length
      ? table(["attached", "kind", "layer", "width"], attached.map((s) => [
        s.id, s.format === "vectors" ? "vector set" : `SAE (${s.architecture})`, String(s.attached_layer),
        String(s.d_sae)]))
      : h("p", { class: "muted" }, "No SAE or vector set attached."));
    if (steering.error) {
      fill(steer, h("p", { class: "muted" }, steering.error.message));
    } else {
      const count = Object.values(steering.saes).reduce((n, s) => n + Object.keys(s.values).length, 0);
      fill(steer, pairs([
        ["steering", steering.enabled ? "on" : "off"],
        ["features set", String(count)],
        ["active profile", steering.active_profile || "none"],
        ["active circuit", circuit && circuit.active ? String(circuit.active) : "none"],
      ]));
    }
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(ctx.fail), EVERY_MS);
  return () => clearInterval(timer);
}
