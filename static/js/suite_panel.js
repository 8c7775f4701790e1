// The Suites panel (with the server's --suite-dir): the suite's cases, a run
// on this model or the second one, its progress while it goes on, the table of
// its asks and a link to its report. The server runs it (vidchat/qa/suite.py);
// this only asks and shows.
import { authHeaders } from "./api.js";
import { esc } from "./state.js";

const POLL_MS = 1000; // while a run goes on: one small request a second
const MARKS = { passed: "✓ passed", failed: "✗ failed", error: "! error" };

function panel() {
  return document.getElementById("vc-suites");
}

async function call(path, init) {
  const r = await fetch(path, { ...(init || {}), headers: authHeaders((init || {}).headers) });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail || r.statusText);
  return body;
}

function showCases(root, data) {
  const where = root.querySelector(".vc-suite-cases");
  if (data.error) {
    where.innerHTML = `<p class="vc-refused">The suite can't be read: ${esc(data.error)}</p>`;
    return;
  }
  if (!data.cases.length) {
    where.innerHTML = "<p class='vc-muted'>No case yet: under an answer, open <em>What the model got</em> and "
      + "press <em>Add to suite</em>.</p>";
    return;
  }
  const rows = data.cases.map((c) => `<tr><td>${esc(c.name)}</td><td>${esc(c.kind)}</td>`
    + `<td>${c.questions.map(esc).join("<br>")}</td><td>${esc(c.note || "")}`
    + `${c.mark ? ` <span class="vc-suite-mark">(${esc(c.mark.mark)})</span>` : ""}</td></tr>`).join("");
  where.innerHTML = `<p><strong>${esc(data.suite)}</strong>: ${data.cases.length} case`
    + `${data.cases.length === 1 ? "" : "s"}</p><table class="vc-suite-table"><thead><tr><th>Case</th>`
    + `<th>Kind</th><th>Questions</th><th>Note</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function showRun(root, run) {
  const progress = root.querySelector(".vc-suite-progress");
  const s = run.summary;
  const counts = `${s.passed} passed, ${s.failed} failed, ${s.errors} errors`;
  if (run.state === "running") {
    progress.textContent = `Running on ${run.model}: ${run.done} of ${run.total} asks done (${counts})…`;
  } else if (run.state === "finished") {
    progress.innerHTML = `Finished on ${esc(run.model)}: ${esc(counts)}. `
      + `<a class="vc-suite-report" href="${esc(run.report)}" target="_blank" rel="noopener">Open the report</a>`
      + ` <span class="vc-muted">(also in ${esc(run.folder)})</span>`;
  } else {
    progress.textContent = `The run on ${run.model} failed: ${run.error}`;
  }
  progress.dataset.state = run.state;
  const rows = run.asks.map((a) => `<tr data-status="${esc(a.status)}"><td>${esc(a.case)} #${a.ask}</td>`
    + `<td>${esc(a.question)}</td><td>${MARKS[a.status] || esc(a.status)}</td>`
    + `<td>${a.changed_from_baseline == null ? "no baseline" : a.changed_from_baseline ? "changed" : "same"}</td>`
    + `<td>${esc(a.error || a.answer)}</td></tr>`).join("");
  root.querySelector(".vc-suite-results").innerHTML = run.asks.length
    ? `<table class="vc-suite-table"><thead><tr><th>Ask</th><th>Question</th><th>Result</th>`
      + `<th>Baseline</th><th>Answer</th></tr></thead><tbody>${rows}</tbody></table>` : "";
  for (const b of root.querySelectorAll(".vc-suite-run")) b.disabled = run.state === "running";
}

async function follow(root, runId) {
  for (;;) {
    let run;
    try {
      run = await call(`/suites/runs/${encodeURIComponent(runId)}`);
    } catch (err) {
      root.querySelector(".vc-suite-progress").textContent = `Can't follow the run: ${err.message}`;
      for (const b of root.querySelectorAll(".vc-suite-run")) b.disabled = false;
      return;
    }
    showRun(root, run);
    if (run.state !== "running") return;
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

async function refresh(root) {
  try {
    const data = await call("/suites");
    showCases(root, data);
    if (data.run) {
      showRun(root, data.run);
      if (data.run.state === "running" && !root.dataset.following) {
        root.dataset.following = data.run.run;
        follow(root, data.run.run).finally(() => { delete root.dataset.following; });
      }
    }
  } catch (err) {
    root.querySelector(".vc-suite-cases").textContent = `Can't read the suite: ${err.message}`;
  }
}

// The panel's markup, once Gradio has drawn it (a closed accordion may not have yet).
function whenPanel(then) {
  const root = panel();
  if (root) {
    then(root);
    return;
  }
  const looking = new MutationObserver(() => {
    const found = panel();
    if (!found) return;
    looking.disconnect();
    then(found);
  });
  looking.observe(document.body, { childList: true, subtree: true });
}

// Read the suite each time the panel opens: Add to suite may have added a case since.
document.addEventListener("click", (e) => {
  if (e.target.closest?.("#vc-suites-panel") && !e.target.closest("#vc-suites")) {
    whenPanel(refresh);
    return;
  }
  const run = e.target.closest?.(".vc-suite-run");
  const root = panel();
  if (!run || !root) return;
  for (const b of root.querySelectorAll(".vc-suite-run")) b.disabled = true;
  const progress = root.querySelector(".vc-suite-progress");
  progress.textContent = "Starting the run…";
  call("/suites/run", { method: "POST", headers: { "Content-Type": "application/json" },
                        body: JSON.stringify({ engine: run.dataset.engine }) })
    .then((started) => {
      root.dataset.following = started.run;
      showRun(root, started);
      return follow(root, started.run).finally(() => { delete root.dataset.following; });
    })
    .catch((err) => {
      progress.textContent = `Not started: ${err.message}`;
      for (const b of root.querySelectorAll(".vc-suite-run")) b.disabled = false;
    });
}, true);

export { refresh as refreshSuites };
