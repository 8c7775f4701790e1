// Add to suite (the server's --suite-dir, docs/suites.md): the form under
// "What the model got" saves that answer as a case of the suite and says where.
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
    said.textContent = r.ok ? `added as case “${body.case}” to ${body.suite}`
                            : `not added: ${body.detail || r.statusText}`;
    form.dataset.added = r.ok ? body.case : "";
  } catch (err) {
    said.textContent = `not added: ${err}`;
  } finally {
    button.disabled = false;
  }
}, true);
