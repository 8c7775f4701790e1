// Questions: typing warms the session's prompt on the server, and a question
// is one request (POST /webrtc/ask) that returns its ticket; its outcome is
// drawn in the chat from the session's events (static/js/chat.js).
import { authHeaders } from "./api.js";
import { questionSent, questions, saidWithoutSession } from "./chat.js";
import { readSettings } from "./settings.js";
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

// Gradio listens to `input` events: a plain `.value =` would leave its copy of the box as it was.
function setBox(area, value) {
  const proto = area.tagName === "TEXTAREA" ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
  Object.getOwnPropertyDescriptor(proto, "value").set.call(area, value);
  area.dispatchEvent(new Event("input", { bubbles: true }));
}

function say(text) {
  const note = $("#vc-refused");
  if (!note) return;
  note.textContent = text;
  note.hidden = !text;
}

async function send() {
  const area = $("#vc-question textarea");
  const text = area?.value ?? "";
  if (!text.trim() || !settingsAccepted()) return;
  setBox(area, "");  // the box empties as the question goes, and stays editable meanwhile
  questions.asked += 1;
  if (!state.sessionId) {
    saidWithoutSession(text);
    questionSent(null);
    return;
  }
  let reply = {};
  try {
    const r = await fetch("/webrtc/ask", {
      method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({ session_id: state.sessionId, question: text, settings: readSettings() }),
    });
    reply = await r.json().catch(() => ({}));
    if (!r.ok) reply = { refused: typeof reply.detail === "string" ? reply.detail : `HTTP ${r.status}` };
  } catch (err) {
    reply = { refused: `The question did not reach the server (${err.message}).` };
  }
  if (reply.refused) {
    if (!area.value) setBox(area, text);  // not asked: the question is back in its box to send again
    say(`⚠ ${reply.refused}`);
  } else {
    say("");
  }
  questionSent(Number.isInteger(reply.ticket) ? reply.ticket : null);
}

// Enter sends (Shift+Enter: a new line), and so does Send. Listened for
// while the key travels down (capture), before Gradio's own handling of the box.
document.addEventListener("keydown", (e) => {
  if (e.key !== "Enter" || e.shiftKey || e.isComposing || !e.target?.closest?.("#vc-question")) return;
  e.preventDefault();
  e.stopImmediatePropagation();
  send();
}, true);
document.addEventListener("click", (e) => {
  if (!e.target?.closest?.("#vc-send")) return;
  send();
}, true);
