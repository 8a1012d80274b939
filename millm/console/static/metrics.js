// Reading the server's Prometheus text (/metrics): the totals the dashboard turns into rates.

/** Sum every sample of the named metric families in Prometheus text: {name: total}; ``only`` keeps the samples
 *  whose labels contain it (e.g. 'route="/v1/'). */
export function totals(text, names, only = "") {
  const out = Object.fromEntries(names.map((n) => [n, null]));
  for (const line of String(text).split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match || !(match[1] in out) || !(match[2] || "").includes(only)) continue;
    const value = Number(match[3]);
    if (Number.isFinite(value)) out[match[1]] = (out[match[1]] || 0) + value;
  }
  return out;
}

/** Per-second rates between two readings of totals (null where either is missing). */
export function rates(before, after, seconds) {
  const out = {};
  for (const name of Object.keys(after)) {
    const a = before && before[name];
    const b = after[name];
    out[name] = a === null || a === undefined || b === null || seconds <= 0 ? null : Math.max(0, (b - a) / seconds);
  }
  return out;
}
