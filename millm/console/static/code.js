// "Copy as code": a chat request as the console sends it, written as curl, as OpenAI SDK Python (miLLM's own
// fields in extra_body) and, for its steering, as a profile document. The request is the non-streamed twin of the
// one the page streamed: the same fields, so the same seed gives the same text.

import { h } from "./dom.js";

const OPENAI_FIELDS = new Set(["model", "messages", "temperature", "top_p", "max_tokens", "seed", "stop",
                               "frequency_penalty", "presence_penalty", "n"]);

/** ``text`` inside single quotes for a POSIX shell. */
export function shellQuote(text) {
  return `'${String(text).replaceAll("'", "'\\''")}'`;
}

/** The request body without streaming (what a script sends for the same answer in one piece). */
export function plain(body) {
  const out = { ...body };
  delete out.stream;
  return out;
}

export function curl(base, body) {
  return `curl -s ${shellQuote(`${base}/v1/chat/completions`)} -H 'Content-Type: application/json' \\\n`
    + `  -d ${shellQuote(JSON.stringify(plain(body)))}`;
}

function python(value) {
  return JSON.stringify(value, null, 0).replaceAll(":true", ":True").replaceAll(":false", ":False")
    .replaceAll(":null", ":None");
}

export function sdk(base, body) {
  const own = Object.entries(plain(body)).filter(([k]) => OPENAI_FIELDS.has(k));
  const extra = Object.fromEntries(Object.entries(plain(body)).filter(([k]) => !OPENAI_FIELDS.has(k)));
  const args = own.map(([k, v]) => `    ${k}=${python(v)},`);
  if (Object.keys(extra).length) args.push(`    extra_body=${python(extra)},`);
  return ["from openai import OpenAI", "", `client = OpenAI(base_url=${JSON.stringify(`${base}/v1`)}, `
    + "api_key=\"not-needed\")", "answer = client.chat.completions.create(", ...args, ")",
  "print(answer.choices[0].message.content)"].join("\n");
}

/** A block of the three forms, each in a <pre> with a copy button. */
export function codeBlock(base, body, profile) {
  const forms = [["curl", curl(base, body)], ["OpenAI SDK (Python)", sdk(base, body)]];
  if (profile) forms.push(["profile JSON (POST /api/profiles/import)", JSON.stringify(profile, null, 2)]);
  return h("div", { class: "code" }, forms.map(([title, text]) => h("details", { "data-form": title },
    h("summary", null, title, " ", h("button", { type: "button", class: "small", onclick: (e) => {
      e.preventDefault();
      navigator.clipboard.writeText(text).catch(() => {});
    } }, "copy")),
    h("pre", null, text))));
}
