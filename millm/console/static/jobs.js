// Background jobs (learning a vector set, pulling a model): follow one until it ends, and say how it failed in
// the server's own words.

import { get } from "./api.js";

const FOLLOW_MS = 500;

/** Whether ``job`` has yet to end. */
export const running = (job) => ["queued", "running"].includes(job.status);

/** A job's error as "code: message", or "" when it has none. */
export function failure(job) {
  const e = job.error && typeof job.error === "object" ? job.error.error || job.error : null;
  return e ? `${e.code || "error"}: ${e.message || ""}` : job.error ? String(job.error) : "";
}

/** Read the job at ``path`` every half second: ``show(job)`` after each reading, ``ended(job)`` once it has
 * ended, ``fail(err)`` if a reading is refused. Returns the function that stops following. */
export function follow(path, { show, ended, fail }) {
  const timer = setInterval(async () => {
    try {
      const job = await get(path);
      show(job);
      if (!running(job)) {
        clearInterval(timer);
        await ended(job);
      }
    } catch (err) {
      clearInterval(timer);
      fail(err);
    }
  }, FOLLOW_MS);
  return () => clearInterval(timer);
}
