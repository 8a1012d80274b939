// Steering: the live strengths, one row per feature (label, slider, number box, the ±200 clamp, the recommended
// strength marked), the on/off toggle that keeps values, batch add, clear and "save as profile". Every change
// is a PATCH /api/steering; the page then shows the server's answer, which is what is running now.

import { del, get, patch, post } from "../api.js";
import { fill, field, h, section } from "../dom.js";
import {
  CLAMP, card, clamp, recommendedText, resolveSteer, vectorCard,
} from "../features.js";

const FOLLOW_MS = 2000;

function liveLine(state) {
  if (state.live === false) {
    return "Pending: a running request restores its own values first; these apply when it ends.";
  }
  return state.enabled ? "Live: these values steer every request from the next decode step."
    : "Steering is off: the values are kept and steer nothing until it is turned on.";
}

function row(sae, index, strength, apply, isVectorSet) {
  const label = h("span", { class: "label" }, "…");
  const rec = h("span", { class: "rec muted" });
  const listId = `rec-${sae}-${index}`.replace(/[^a-zA-Z0-9_-]/g, "_");
  const marks = h("datalist", { id: listId });
  const slider = h("input", { type: "range", min: -CLAMP, max: CLAMP, step: 1, value: strength,
                              class: "slider", list: listId, "aria-label": `strength of feature ${index}` });
  const box = h("input", { type: "number", min: -CLAMP, max: CLAMP, step: "any", value: strength, class: "strength",
                           "aria-label": `strength of feature ${index} (number)` });
  slider.addEventListener("input", () => { box.value = slider.value; });
  slider.addEventListener("change", () => apply(sae, index, Number(slider.value)));
  box.addEventListener("change", () => {
    const value = clamp(box.value);
    box.value = value;
    slider.value = value;
    apply(sae, index, value);
  });
  (isVectorSet ? vectorCard(sae, index) : card(sae, index)).then((c) => {
    label.textContent = c.label || "(no label)";
    if (c.recommended_strength !== null && c.recommended_strength !== undefined) {
      rec.textContent = `recommended ${recommendedText(c)}`;
      marks.append(h("option", { value: c.recommended_strength }));
    }
  }).catch(() => { label.textContent = "(no card)"; });
  const remove = h("button", { type: "button", class: "small", onclick: () => apply(sae, index, 0) }, "remove");
  return h("tr", { "data-feature": index, "data-sae": sae },
    h("td", null, String(index)), h("td", null, label), h("td", null, slider, marks), h("td", null, box),
    h("td", null, rec), h("td", null, remove));
}

export async function render(root, ctx) {
  const toggle = h("input", { type: "checkbox", id: "steering-enabled" });
  const live = h("p", { id: "steering-live", class: "muted" });
  const rows = h("div", { id: "steering-rows" });
  const saePick = h("select", { id: "batch-sae" });
  const batch = h("input", { id: "batch", placeholder: "123=40, music=20", size: 30 });
  const profileName = h("input", { id: "profile-name", placeholder: "profile name" });
  let state = null;
  // vector sets steer like SAEs; their rows are labelled by the vectors' names (a set has no feature cards)
  const vectorSets = new Set((await get("/api/saes")).data.filter((x) => x.format === "vectors").map((x) => x.id));

  // the rows' identity: while the same features are set, a change updates values in place (a slider being
  // dragged or stepped with the keyboard keeps its focus)
  const signature = (st) => JSON.stringify(Object.entries(st.saes).map(([id, s]) => [id, Object.keys(s.values)]));

  function update(next) {
    for (const [id, sae] of Object.entries(next.saes)) {
      for (const [index, value] of Object.entries(sae.values)) {
        const tr = rows.querySelector(`tr[data-sae="${CSS.escape(id)}"][data-feature="${CSS.escape(index)}"]`);
        for (const input of tr ? tr.querySelectorAll("input") : []) {
          if (input !== document.activeElement) input.value = value;
        }
      }
    }
  }

  function show(next) {
    const same = state !== null && signature(state) === signature(next);
    state = next;
    toggle.checked = next.enabled;
    live.textContent = liveLine(next);
    if (same) {
      update(next);
      return;
    }
    const ids = Object.keys(next.saes);
    const picked = saePick.value;
    fill(saePick, ids.map((id) => h("option", { value: id }, id)));
    if (ids.includes(picked)) saePick.value = picked;
    if (!ids.length) {
      fill(rows, h("p", { class: "muted" }, "No SAE attached: attach one on the SAEs page to steer by its features."));
      return;
    }
    fill(rows, ids.map((id) => {
      const entries = Object.entries(next.saes[id].values);
      return h("div", { class: "sae-block" },
        h("h3", null, `${id} · layer ${next.saes[id].layer}`),
        entries.length
          ? h("table", { class: "steer" },
            h("thead", null, h("tr", null, ["feature", "label", `strength (±${CLAMP})`, "", "", ""].map(
              (c) => h("th", null, c)))),
            h("tbody", null, entries.map(([index, value]) => row(id, Number(index), value, apply,
              vectorSets.has(id)))))
          : h("p", { class: "muted" }, "No features set on this SAE."));
    }));
  }

  async function apply(sae, index, value) {
    const next = await ctx.attempt(() => patch("/api/steering", { sae, values: { [index]: clamp(value) } }));
    if (next) show(next);
  }

  toggle.addEventListener("change", async () => {
    const next = await ctx.attempt(() => post(`/api/steering/${toggle.checked ? "enable" : "disable"}`));
    if (next) show(next); else toggle.checked = !toggle.checked;
  });

  async function addBatch() {
    const sae = saePick.value;
    let said = [];
    const next = await ctx.attempt(async () => {
      if (!sae) throw new Error("Attach an SAE first.");
      const resolved = await resolveSteer(sae, batch.value);
      said = resolved.said;
      const values = Object.fromEntries(Object.entries(resolved.values).map(([i, v]) => [i, clamp(v)]));
      return patch("/api/steering", { sae, values });
    });
    if (next && said.length) ctx.say(`Steering at the recommended strength: ${said.join("; ")}.`);
    if (next) {
      batch.value = "";
      show(next);
    }
  }

  const clearButton = h("button", { type: "button", id: "steering-clear", onclick: async () => {
    const next = await ctx.attempt(() => del("/api/steering"), "Cleared every value.");
    if (next) show(next);
  } }, "Clear all");
  const saveButton = h("button", { type: "button", id: "profile-save", onclick: () => ctx.attempt(
    () => post("/api/profiles", { name: profileName.value.trim(), from_current: true }),
    (p) => `Saved profile "${p.name}" from the live values.`) }, "Save as profile");

  root.append(
    section("Live steering", h("label", { class: "toggle" }, toggle, " steering on"), live, rows),
    section("Add features",
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); addBatch(); } },
        field("SAE", saePick), field("features", batch), h("button", { type: "submit", id: "batch-add" }, "Add"))),
    section("Keep", h("div", { class: "inline" }, clearButton, profileName, saveButton)));
  show(await get("/api/steering"));
  // another client (the TUI, a script, a profile activated elsewhere) may change steering: follow it
  const timer = setInterval(() => get("/api/steering").then(show).catch(ctx.fail), FOLLOW_MS);
  return () => clearInterval(timer);
}

