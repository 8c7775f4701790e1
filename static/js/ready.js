// Readiness: while the model loads, the page says so until it is ready.
import { $ } from "./state.js";

// While the model loads the port already answers: say so, with the time so
// far, until /readyz says ready (or why it failed).
async function watchReadiness() {
  for (;;) {
    const el = $("#vc-ready");  // Gradio may render the panel after this starts
    try {
      const r = await fetch("/readyz", { cache: "no-store" });
      const body = await r.json().catch(() => ({}));
      if (el) {
        el.textContent = r.ok ? "" : body.reason || "The model is not ready.";
        el.dataset.tone = r.ok ? "" : (body.reason || "").startsWith("Loading") ? "busy" : "error";
      }
      if (r.ok || !(body.reason || "").startsWith("Loading")) return;
    } catch (_) { /* the server restarting: keep asking */ }
    await new Promise((res) => setTimeout(res, 1000));
  }
}
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watchReadiness);
else watchReadiness();
