// Questions: typing warms the session's prompt on the server, and Enter
// takes the question's frames at once (vidchat/conversation/warmup.py).
import { authHeaders } from "./api.js";
import { settingsAccepted } from "./slider_checks.js";
import { $, state } from "./state.js";

// Typing a question: the server warms this session's prompt at once
// (vidchat/conversation/warmup.py), so the answer starts sooner. At most every 1.5 s.
let lastTypingSignal = 0;
document.addEventListener("input", (e) => {
  if (!e.target?.closest?.("#vc-question") || !state.sessionId) return;
  const now = performance.now();
  if (now - lastTypingSignal < 1500) return;
  lastTypingSignal = now;
  fetch("/webrtc/typing", { method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
                            body: JSON.stringify({ session_id: state.sessionId }) }).catch(() => {});
}, true);

// Sending the question: the server takes its frames and audio now, as Enter
// is pressed, and warms exactly them while Gradio carries the question over
// (vidchat/conversation/warmup.py question_now). Listened for while the key travels
// down (capture), so this leaves before Gradio's own submit.
function questionSent() {
  if (!state.sessionId) return;
  fetch("/webrtc/typing", { method: "POST", keepalive: true,
                            headers: authHeaders({ "Content-Type": "application/json" }),
                            body: JSON.stringify({ session_id: state.sessionId, enter: true }) }).catch(() => {});
}
// Each Enter (or Send) is one typed question's chat event: counted here,
// as it happens, so window.vidchat.questions.asked is up before its answer
// can show (the event's end counts it finished, vidchat/doors/page/layout.py).
function questionAsked() {
  if (window.vidchat?.questions) window.vidchat.questions.asked += 1;
}
// A refused setting (vidchat's slider checks) keeps the question from going.
function refuse(e) {
  e.preventDefault();
  e.stopImmediatePropagation();
}
document.addEventListener("keydown", (e) => {
  if (e.key !== "Enter" || e.shiftKey || e.isComposing || !e.target?.closest?.("#vc-question")) return;
  if (!settingsAccepted()) { refuse(e); return; }
  questionAsked();
  if (!e.target.value?.trim()) return;
  questionSent();
}, true);
document.addEventListener("click", (e) => {
  if (!e.target?.closest?.("#vc-send")) return;
  if (!settingsAccepted()) { refuse(e); return; }
  questionAsked();
}, true);
document.addEventListener("pointerdown", (e) => {
  if (e.target?.closest?.("#vc-send") && $("#vc-question textarea")?.value.trim() && settingsAccepted()) questionSent();
}, true);
