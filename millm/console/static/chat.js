// A streamed chat completion: /v1/chat/completions with stream on, the text handed over as it arrives, the
// steering the answer ran under (X-miLLM-Steering) and how it finished returned at the end.

import { ApiError, events, headers, read } from "./api.js";

/** Stream ``body``'s answer: ``onText(piece)`` per piece; resolves to {steering, finish, chunks} (chunks: every
 *  parsed event, for what a page reads beside the text). */
export async function stream(body, onText, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(true), body: JSON.stringify(body), cache: "no-store", signal,
  });
  if (!response.ok) await read(response); // throws the refusal
  const steering = response.headers.get("X-miLLM-Steering") || "not reported";
  let finish = null;
  const chunks = [];
  for await (const { data } of events(response)) {
    if (data === "[DONE]") continue;
    const chunk = JSON.parse(data);
    chunks.push(chunk);
    if (chunk.error) throw new ApiError(500, chunk.error.code || "error", chunk.error.message);
    for (const choice of chunk.choices || []) {
      if (choice.delta && choice.delta.content) onText(choice.delta.content);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return { steering, finish, chunks };
}
