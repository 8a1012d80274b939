// Playground: a chat against /v1/chat/completions, streamed, with sampling settings and a seed, showing the
// steering each answer ran under (the X-miLLM-Steering header). Model text is shown as text, never markup.
// Its steering is a condition as the Compare page writes one (live, off, profile:NAME, SAE#INDEX=STRENGTH); a
// read-out SAE asks each answer's return_sae_activations (token_text, labels), shown as clickable shaded tokens.
// The whole state of the last answer is in its link (#/playground?...), and "Copy as code" writes its request.

import { get } from "../api.js";
import { stream } from "../chat.js";
import { codeBlock } from "../code.js";
import { field, fill, h } from "../dom.js";
import { readoutOf, readoutView } from "../readouts.js";
import { condition, saveProfile } from "./compare.js";

const READ_TOP_K = 8;

export async function render(root, ctx, route) {
  const q = route ? route.query : new URLSearchParams();
  const transcript = h("div", { id: "transcript", class: "transcript" });
  const prompt = h("textarea", { id: "prompt", rows: 3, placeholder: "Say something…" });
  const model = h("input", { id: "pg-model", size: 28 });
  const temperature = h("input", { id: "pg-temperature", type: "number", min: 0, max: 2, step: 0.1, value: 0.7 });
  const maxTokens = h("input", { id: "pg-max-tokens", type: "number", min: 1, step: 1, value: 64 });
  const seed = h("input", { id: "pg-seed", type: "number", step: 1, placeholder: "none" });
  const scope = h("select", { id: "pg-scope" }, ["", "all", "generated", "prompt"].map(
    (v) => h("option", { value: v }, v || "server's default")));
  const steering = h("p", { id: "pg-steering", class: "muted" }, "X-miLLM-Steering: (no answer yet)");
  const steerWith = h("input", { id: "pg-condition", size: 30, value: q.get("c") || "live",
                                 placeholder: "live, off, profile:NAME, SAE#INDEX=STRENGTH" });
  const readoutSae = h("select", { id: "pg-readout" }, h("option", { value: "" }, "none"));
  const shade = h("input", { id: "pg-shade", type: "number", min: 0, size: 6, placeholder: "feature",
                             value: q.get("shade") || "" });
  const link = h("a", { id: "pg-link", href: "#/playground" }, "link to this answer");
  const code = h("div", { id: "pg-code" });
  const send = h("button", { type: "submit", id: "pg-send" }, "Send");
  const stop = h("button", { type: "button", id: "pg-stop", disabled: true, onclick: () => running && running.abort() },
    "Stop");
  const messages = [];
  let running = null; // the AbortController of the answer streaming now

  const inference = await get("/api/health/inference").catch(() => ({}));
  model.value = q.get("model") || inference.model || "";
  for (const [input, key] of [[temperature, "temperature"], [maxTokens, "max_tokens"], [seed, "seed"]]) {
    if (q.has(key)) input.value = q.get(key);
  }
  const attached = (await get("/api/saes").catch(() => ({ data: [] }))).data.filter((x) => x.attached_layer !== null);
  readoutSae.append(...attached.map((x) => h("option", { value: x.id }, x.id)));
  if (q.get("readout")) readoutSae.value = q.get("readout");
  if (q.get("scope")) scope.value = q.get("scope");
  if (q.get("m")) {
    const given = JSON.parse(q.get("m"));
    const last = given.pop();
    for (const m of given) {
      messages.push(m);
      bubble(m.role, m.content);
    }
    prompt.value = last ? last.content : "";
  }

  /** The address that reproduces ``body``'s answer on this server (its fields and the page's settings). */
  function address(body) {
    const out = new URLSearchParams({ m: JSON.stringify(body.messages), model: body.model,
                                      temperature: String(body.temperature), max_tokens: String(body.max_tokens),
                                      c: steerWith.value.trim() || "live" });
    if (body.seed !== undefined) out.set("seed", String(body.seed));
    if (body.steering_scope) out.set("scope", body.steering_scope);
    if (readoutSae.value) out.set("readout", readoutSae.value);
    if (shade.value !== "") out.set("shade", shade.value);
    return `#/playground?${out}`;
  }

  function bubble(role, text) {
    const node = h("div", { class: `msg ${role}` }, h("b", null, role), h("span", { class: "text" }, text));
    transcript.append(node);
    return node.querySelector(".text");
  }

  async function ask() {
    const text = prompt.value.trim();
    if (!text) return;
    const chosen = condition(steerWith.value.trim() || "live");
    if (chosen.profile) await saveProfile(chosen.profile);
    prompt.value = "";
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const out = bubble("assistant", "");
    out.parentElement.dataset.state = "streaming";
    const body = { model: model.value.trim(), messages: [...messages], stream: true,
                   temperature: Number(temperature.value), max_tokens: Number(maxTokens.value) };
    if (seed.value !== "") body.seed = Number(seed.value);
    if (scope.value) body.steering_scope = scope.value; // steer every position, the generated or the prompt's
    Object.assign(body, chosen.extra);
    if (readoutSae.value) {
      body.return_sae_activations = { sae_id: readoutSae.value, top_k: READ_TOP_K, positions: "completion",
                                      token_text: true, labels: true };
    }
    link.href = address(body);
    fill(code, codeBlock(location.origin, body, chosen.profile));
    send.disabled = true;
    stop.disabled = false;
    running = new AbortController();
    try {
      const result = await stream(body, (piece) => { out.textContent += piece; }, running.signal);
      messages.push({ role: "assistant", content: out.textContent });
      steering.textContent = `X-miLLM-Steering: ${result.steering}`;
      const readout = readoutOf(result.chunks);
      if (readout) {
        const read = readout.positions.map((p) => p.token ?? "").join("");
        const rest = out.textContent.startsWith(read) ? out.textContent.slice(read.length) : "";
        out.parentElement.append(readoutView(readout, rest, ctx, shade.value === "" ? null : Number(shade.value)));
      }
      out.parentElement.dataset.state = `done:${result.finish}`;
    } catch (err) {
      if (err.name === "AbortError") {
        messages.push({ role: "assistant", content: out.textContent }); // what came before Stop stays
        out.parentElement.dataset.state = "stopped";
      } else {
        messages.pop();
        out.parentElement.dataset.state = "failed";
        ctx.fail(err);
      }
    } finally {
      send.disabled = false;
      stop.disabled = true;
      running = null;
    }
  }

  root.append(h("section", { class: "card" },
    h("div", { class: "inline" }, field("model", model), field("temperature", temperature),
      field("max tokens", maxTokens), field("seed", seed), field("steering scope", scope),
      field("steering", steerWith), field("read-out SAE", readoutSae), field("shade feature", shade),
      h("button", { type: "button", id: "pg-reset", onclick: () => {
        messages.length = 0;
        fill(transcript);
      } }, "New chat")),
    transcript, steering,
    h("form", { class: "chat", onsubmit: (e) => { e.preventDefault(); ctx.attempt(ask); } }, prompt, send, stop),
    h("p", { class: "muted" }, link), code));
  return () => running && running.abort();
}
