// The page's shared state and its few common controls: the status line, the
// note under it, and the hidden field that carries this tab's session id.

export const state = {
  pc: null,
  stream: null,
  sessionId: "",
  resumeToken: "",   // proves to the server that this tab owns sessionId
  fileUrl: "",       // the video file chosen as a source (a blob: URL, or /media/<name>)
  fileName: "",      // its name, for the answer records (never a path)
  reporting: false,  // a /webrtc/source report is in flight
  reports: [],  // reports read at their events, waiting their turn
  fileClock: null,  // the file's last report: where the server puts its frames until the next
  ticks: 0,
  last: null,        // the previous stats poll, for rates
  statsTimer: null,
  statsLoop: null,  // the running poll loop; a new one (or none) ends the old
  wantRunning: false,
  run: 0,            // bumped by Start and Stop: a reconnect loop of an older run gives up
  reconnecting: false,
};

export const $ = (sel) => document.querySelector(sel);

export function setStatus(text, tone) {
  const el = $("#vc-conn");
  if (!el) return;
  el.textContent = text;
  el.dataset.tone = tone || "idle";
}

// onRetry: a "Try again" button after the note runs it.
export function setNote(text, onRetry) {
  const el = $("#vc-note");
  if (!el) return;
  el.textContent = text || "";
  if (onRetry) {
    const btn = document.createElement("button");
    btn.className = "vc-btn vc-retry";
    btn.textContent = "Try again";
    btn.addEventListener("click", () => onRetry());
    el.append(" ", btn);
  }
}

// Gradio listens to `input` events; a plain `.value =` would not reach the
// server. The page's own modules hear of it as a "vidchat:session" event
// (static/js/chat.js reads the new session's chat).
export function publishSessionId(id) {
  state.sessionId = id;
  document.dispatchEvent(new CustomEvent("vidchat:session", { detail: id }));
  const box = document.querySelector("#vidchat-session-id textarea, #vidchat-session-id input");
  if (!box) return;
  const proto = box.tagName === "TEXTAREA" ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
  Object.getOwnPropertyDescriptor(proto, "value").set.call(box, id);
  box.dispatchEvent(new Event("input", { bubbles: true }));
}

// This tab's session survives a reload: its id and resume token are kept in
// the tab's own sessionStorage (never shared with other tabs or sites) from
// the moment the server gives them until the session ends.
const RESUME_KEY = "vidchat.session";
// paused: the tab had stopped its source (a reload comes back stopped, to the same chat).
export function keepResume(paused = false) {
  try {
    sessionStorage.setItem(RESUME_KEY, JSON.stringify({ id: state.sessionId, token: state.resumeToken, paused }));
  } catch (_) { /* storage off: a reload starts a new session */ }
  returningIds(state.sessionId, true);
}
export function forgetResume() {
  try { sessionStorage.removeItem(RESUME_KEY); } catch (_) {}
  returningIds(state.sessionId, false);
}

// The ids of this browser's live sessions, in a cookie that a reload's
// request for the page carries: the server then waits for the reloaded tab
// past the reload grace (vidchat/doors/webrtc_routes.py ReturningTabs),
// which its scripts, run after Gradio's, can outlast on a slow machine or
// network. Ids only: they grant nothing. At most the newest 8.
const RETURNING_COOKIE = "vidchat_returning";
function returningIds(id, keep) {
  if (!id) return;
  const found = document.cookie.split("; ").find((c) => c.startsWith(`${RETURNING_COOKIE}=`));
  const ids = (found ? decodeURIComponent(found.slice(RETURNING_COOKIE.length + 1)) : "")
    .split(".").filter((x) => x && x !== id);
  if (keep) ids.push(id);
  document.cookie = `${RETURNING_COOKIE}=${encodeURIComponent(ids.slice(-8).join("."))}; path=/; SameSite=Strict`;
}
// The session this tab had before it was reloaded (null otherwise).
export function resumeAfterReload() {
  const nav = performance.getEntriesByType?.("navigation")?.[0];
  if (nav?.type !== "reload") return null;
  try {
    const kept = JSON.parse(sessionStorage.getItem(RESUME_KEY) || "null");
    return kept && typeof kept.id === "string" && typeof kept.token === "string" ? kept : null;
  } catch (_) { return null; }
}

// Resolves once Gradio has drawn the element (it renders after this module runs).
export function whenShown(selector) {
  if ($(selector)) return Promise.resolve($(selector));
  return new Promise((resolve) => {
    const seen = new MutationObserver(() => {
      if ($(selector)) { seen.disconnect(); resolve($(selector)); }
    });
    seen.observe(document.documentElement, { childList: true, subtree: true });
  });
}

// Text the server or a user wrote, safe in HTML markup and in an attribute's quotes.
export function esc(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
