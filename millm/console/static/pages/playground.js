// Playground: a chat against /v1/chat/completions, streamed, with sampling settings and a seed, showing the
// steering each answer ran under (the X-miLLM-Steering header). Model text is shown as text, never markup.

import { get } from "../api.js";
import { stream } from "../chat.js";
import { field, fill, h } from "../dom.js";

export async function render(root, ctx) {
  const transcript = h("div", { id: "transcript", class: "transcript" });
  const prompt = h("textarea", { id: "prompt", rows: 3, placeholder: "Say something…" });
  const model = h("input", { id: "pg-model", size: 28 });
  const temperature = h("input", { id: "pg-temperature", type: "number", min: 0, max: 2, step: 0.1, value: 0.7 });
  const maxTokens = h("input", { id: "pg-max-tokens", type: "number", min: 1, step: 1, value: 64 });
  const seed = h("input", { id: "pg-seed", type: "number", step: 1, placeholder: "none" });
  const scope = h("select", { id: "pg-scope" }, ["", "all", "generated", "prompt"].map(
    (v) => h("option", { value: v }, v || "server's default")));
  const steering = h("p", { id: "pg-steering", class: "muted" }, "X-miLLM-Steering: (no answer yet)");
  const send = h("button", { type: "submit", id: "pg-send" }, "Send");
  const stop = h("button", { type: "button", id: "pg-stop", disabled: true, onclick: () => running && running.abort() },
    "Stop");
  const messages = [];
  let running = null; // the AbortController of the answer streaming now

  const inference = await get("/api/health/inference").catch(() => ({}));
  model.value = inference.model || "";

  function bubble(role, text) {
    const node = h("div", { class: `msg ${role}` }, h("b", null, role), h("span", { class: "text" }, text));
    transcript.append(node);
    return node.querySelector(".text");
  }

  async function ask() {
    const text = prompt.value.trim();
    if (!text) return;
    prompt.value = "";
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const out = bubble("assistant", "");
    out.parentElement.dataset.state = "streaming";
    const body = { model: model.value.trim(), messages: [...messages], stream: true,
                   temperature: Number(temperature.value), max_tokens: Number(maxTokens.value) };
    if (seed.value !== "") body.seed = Number(seed.value);
    if (scope.value) body.steering_scope = scope.value; // steer every position, the generated or the prompt's
    send.disabled = true;
    stop.disabled = false;
    running = new AbortController();
    try {
      const result = await stream(body, (piece) => { out.textContent += piece; }, running.signal);
      messages.push({ role: "assistant", content: out.textContent });
      steering.textContent = `X-miLLM-Steering: ${result.steering}`;
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
      h("button", { type: "button", id: "pg-reset", onclick: () => {
        messages.length = 0;
        fill(transcript);
      } }, "New chat")),
    transcript, steering,
    h("form", { class: "chat", onsubmit: (e) => { e.preventDefault(); ask(); } }, prompt, send, stop)));
  return () => running && running.abort();
}
