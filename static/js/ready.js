// Readiness: while the model loads, the page says so until it is ready.
import { $ } from "./state.js";

// While the model loads the port already answers: say so, with the time so
// far, until /readyz says ready (or why it failed). Asked with ?page=1, it
// answers 200 either way (a 503 a second would be a console error a second).
async function watchReadiness() {
  for (;;) {
    const el = $("#vc-ready");  // Gradio may render the panel after this starts
    try {
      const r = await fetch("/readyz?page=1", { cache: "no-store" });
      const body = await r.json().catch(() => ({}));
      const ready = r.ok && body.ready !== false;
      const loading = (body.reason || "").startsWith("Loading");
      if (el) {
        el.textContent = ready ? "" : body.reason || "The model is not ready.";
        el.dataset.tone = ready ? "" : loading ? "busy" : "error";
      }
      if (ready || !loading) return;
    } catch (_) { /* the server restarting: keep asking */ }
    await new Promise((res) => setTimeout(res, 1000));
  }
}
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watchReadiness);
else watchReadiness();
