// Profiles, clusters and circuits: list, create a profile from the live values, import and export JSON
// (upload and download), activate and deactivate, delete; a cluster's dial λ as a slider, a circuit's rung
// and how it would serve now.

import { del, get, post, put, seg } from "../api.js";
import { field, fill, h, num, section, table } from "../dom.js";
import { download, upload } from "../files.js";

function importer(kind, ctx, refresh) {
  const file = h("input", { type: "file", accept: "application/json,.json", id: `${kind}-file` });
  const overwrite = h("input", { type: "checkbox", id: `${kind}-overwrite` });
  const route = kind === "profile" ? "/api/profiles/import" : `/api/${kind}s/import`;
  return h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    await ctx.attempt(async () => post(`${route}${overwrite.checked ? "?overwrite=true" : ""}`, await upload(file)),
      (d) => `Imported ${kind} "${d.name}".`);
    await refresh().catch(ctx.fail);
  } }, field(`import a ${kind} (JSON)`, file), h("label", { class: "toggle" }, overwrite, " overwrite"),
  h("button", { type: "submit", id: `${kind}-import` }, "Import"));
}

/** An imported cluster's or circuit's document (the API nests it under ``document``). */
function doc(row) {
  return row.document || row;
}

function button(label, action, attrs = {}) {
  return h("button", { type: "button", "data-action": label, onclick: action, ...attrs }, label);
}

/** "export": an imported cluster's or circuit's document as it is stored now, downloaded as JSON (import takes it). */
function exporter(kind, row, ctx) {
  return button("export", () => ctx.attempt(async () => {
    const now = await get(`/api/${kind}s/${seg(row.name)}`);
    download(`${row.name}.json`, doc(now));
  }, `Exported "${row.name}".`));
}

/** PUT a profile's entries to the live values (its description kept). */
async function updateFromLive(profile) {
  const live = await get("/api/steering");
  const entries = Object.entries(live.saes).flatMap(([sae, s]) => Object.entries(s.values).map(
    ([feature, strength]) => ({ sae, feature: Number(feature), strength })));
  return put(`/api/profiles/${seg(profile.name)}`, { description: profile.description || "", entries });
}

async function renderProfiles(root, ctx) {
  const list = h("div", { id: "profile-list" });
  const name = h("input", { id: "new-profile", placeholder: "name" });
  const description = h("input", { id: "new-profile-description", placeholder: "description", size: 30 });

  async function refresh() {
    const { data, active } = await get("/api/profiles");
    fill(list, data.length ? table(["profile", "description", "entries", "scope", "active", ""], data.map((p) => [
      p.name, p.description || "", String((p.entries || []).length), p.steering_scope || "all",
      p.name === active ? "active" : "",
      h("span", { "data-profile": p.name },
        p.name === active
          ? button("deactivate", () => act(post("/api/profiles/deactivate"), "Deactivated."))
          : button("activate", () => act(post(`/api/profiles/${seg(p.name)}/activate`), `Activated "${p.name}".`)),
        button("update", () => act(updateFromLive(p), `Updated "${p.name}" to the live values.`)),
        button("export", () => ctx.attempt(async () => download(`${p.name}.json`,
          await get(`/api/profiles/${seg(p.name)}/export`)), `Exported "${p.name}".`)),
        button("delete", () => act(del(`/api/profiles/${seg(p.name)}`), `Deleted "${p.name}".`), { class: "danger" })),
    ]), { id: "profiles-table" }) : h("p", { class: "muted" }, "No profile saved."));
  }

  async function act(promise, message) {
    await ctx.attempt(() => promise, message);
    await refresh().catch(ctx.fail);
  }

  root.append(
    section("Profiles", list),
    section("New profile from the live values", h("form", { class: "inline", onsubmit: (e) => {
      e.preventDefault();
      act(post("/api/profiles", { name: name.value.trim(), description: description.value, from_current: true }),
        `Saved "${name.value.trim()}".`);
    } }, field("name", name), field("description", description), h("button", { type: "submit", id: "profile-create" },
      "Save"))),
    section("Import", importer("profile", ctx, refresh)));
  await refresh();
}

async function renderClusters(root, ctx) {
  function dial(c) {
    const top = (doc(c).intensity_range && doc(c).intensity_range[1]) || 2;
    const shown = h("output", null, num(c.intensity, 2));
    const slider = h("input", { type: "range", min: 0, max: top, step: 0.05, value: c.intensity ?? 1,
                                class: "dial", "aria-label": `dial of ${c.name}` });
    slider.addEventListener("input", () => { shown.textContent = num(slider.value, 2); });
    // the answer updates this row in place: the slider keeps its focus while it is dragged or stepped
    slider.addEventListener("change", async () => {
      const row = await ctx.attempt(() => put(`/api/clusters/${seg(c.name)}/intensity`,
        { lambda: Number(slider.value) }), (r) => `${c.name}: λ ${num(r.intensity, 2)}.`);
      if (row) shown.textContent = num(row.intensity, 2);
    });
    return h("span", { class: "dial-cell" }, slider, shown);
  }

  await renderImported(root, ctx, {
    kind: "cluster", activate: (c) => `/api/profiles/${seg(c.name)}/activate`,
    columns: ["cluster", "SAE layer", "members", "λ"],
    cells: (c) => [c.name, String(doc(c).sae && doc(c).sae.layer !== undefined ? doc(c).sae.layer : "–"),
                   String((doc(c).members || []).length), dial(c)],
  });
}

async function renderCircuits(root, ctx) {
  await renderImported(root, ctx, {
    kind: "circuit", activate: (c) => `/api/circuits/${seg(c.name)}/activate`,
    columns: ["circuit", "members", "rung", "would serve", "why"],
    cells: (c) => [c.name, String((doc(c).members || []).length),
                   String(doc(c).evidence ? doc(c).evidence.rung : "–"),
                   c.steering ? String(c.steering.mode) : "–", c.steering ? String(c.steering.reason || "") : ""],
  });
}

/** An imported kind's page (clusters, circuits): its table with ``cells`` per row and the actions they share
 * (activate by ``activate(row)``'s route, deactivate, export, delete), and the importer. */
async function renderImported(root, ctx, { kind, activate, columns, cells }) {
  const list = h("div", { id: `${kind}-list` });

  async function refresh() {
    const { data } = await get(`/api/${kind}s`);
    fill(list, data.length ? table([...columns, "active", ""], data.map((c) => [
      ...cells(c), c.active ? "active" : "",
      h("span", { [`data-${kind}`]: c.name },
        c.active ? button("deactivate", () => act(post("/api/profiles/deactivate"), "Deactivated."))
          : button("activate", () => act(post(activate(c)), `Activated "${c.name}".`)),
        exporter(kind, c, ctx),
        button("delete", () => act(del(`/api/${kind}s/${seg(c.name)}`), `Deleted "${c.name}".`), { class: "danger" })),
    ]), { id: `${kind}s-table` }) : h("p", { class: "muted" }, `No ${kind} imported.`));
  }

  async function act(promise, message) {
    await ctx.attempt(() => promise, message);
    await refresh().catch(ctx.fail);
  }

  const title = `${kind[0].toUpperCase()}${kind.slice(1)}s`;
  root.append(section(title, list), section("Import", importer(kind, ctx, refresh)));
  await refresh();
}

export const profiles = { render: renderProfiles };
export const clusters = { render: renderClusters };
export const circuits = { render: renderCircuits };
