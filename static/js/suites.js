// What a QA person keeps of an answer, from its "What the model got" panel:
// a verdict (good or bad, with a note), and Add to suite (the server's
// --suite-dir, docs/suites.md), which saves the answer as a case and says where.
import { authHeaders } from "./api.js";
import { $ } from "./state.js";

function suitesOn() {
  return $("#vc-live-access")?.dataset.suites === "on";
}

// The forms come with each answer's panel; they show only on a server that
// keeps a suite, which the live panel's markup says once Gradio has drawn it.
const looking = new MutationObserver(() => {
  if (!$("#vc-live-access")) return;
  looking.disconnect();
  if (suitesOn()) document.body.classList.add("vc-suites");
});
looking.observe(document.documentElement, { childList: true, subtree: true });

document.addEventListener("submit", async (e) => {
  const form = e.target.closest?.(".vc-add-suite");
  if (!form) return;
  e.preventDefault();
  const said = form.querySelector(".vc-add-suite-said");
  const button = form.querySelector("button");
  button.disabled = true;
  said.textContent = "adding…";
  try {
    const r = await fetch(`/inputs/${encodeURIComponent(form.dataset.answer)}/add-to-suite`, {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({ note: form.elements.note.value, expect: form.elements.expect.value }),
    });
    const body = await r.json().catch(() => ({}));
    said.textContent = !r.ok ? `not added: ${body.detail || r.statusText}`
      : `added as case “${body.case}” to ${body.suite}`
        + (body.baseline === false ? " (marked bad: its answer is not kept as the baseline)" : "");
    form.dataset.added = r.ok ? body.case : "";
  } catch (err) {
    said.textContent = `not added: ${err}`;
  } finally {
    button.disabled = false;
  }
}, true);

// Pressing Good or Bad again takes the verdict back.
document.addEventListener("click", async (e) => {
  const button = e.target.closest?.(".vc-mark button");
  if (!button) return;
  const form = button.closest(".vc-mark");
  const said = form.querySelector(".vc-mark-said");
  const mark = button.getAttribute("aria-pressed") === "true" ? "" : button.dataset.mark;
  try {
    const r = await fetch(`/inputs/${encodeURIComponent(form.dataset.answer)}/mark`, {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({ mark, note: form.elements.note.value }),
    });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      said.textContent = `not marked: ${body.detail || r.statusText}`;
      return;
    }
    for (const b of form.querySelectorAll("button")) b.setAttribute("aria-pressed", String(b.dataset.mark === mark));
    const note = body.mark?.note ? `: ${body.mark.note}` : "";
    said.textContent = (mark ? `marked ${mark}${note}` : "verdict taken back")
      + (body.bundle ? " (its recording says so too)" : "");
  } catch (err) {
    said.textContent = `not marked: ${err}`;
  }
}, true);
