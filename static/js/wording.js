// The page's words follow what it is doing: the chosen source names the
// Start and Stop buttons and the question's placeholder (a "camera" button
// that shares a screen leaves a new user guessing), and a control greyed
// while live says why in its tooltip.
import { sourceKind } from "./source.js";
import { $, state, whenShown } from "./state.js";

export const SOURCE_WORDS = {
  camera: { start: "Start camera", stop: "Stop camera", ask: "Ask about the camera…" },
  screen: { start: "Share screen", stop: "Stop sharing", ask: "Ask about the screen…" },
  file: { start: "Play video file", stop: "Stop video file", ask: "Ask about the video…" },
};

// Opened with these, the source keeps them until it is started again.
const FIXED_WHILE_LIVE = ["#vc-res", "#vc-fps", "#vc-camera", "#vc-mic"];

// What Stop (beside Send) does, Watch included: it is not only the answer.
export const STOP_ANSWER_SAYS = "Stops the answer being written; Watch goes off too (tick it again to go on watching).";

const STREAM_WORDS = { start: "Watch stream", stop: "Stop watching", ask: "Ask about the stream…" };

export function sourceWords() {
  return SOURCE_WORDS[sourceKind()] || (sourceKind().startsWith("stream:") ? STREAM_WORDS : SOURCE_WORDS.camera);
}

export function showSourceWords() {
  const words = sourceWords();
  const start = $("#vc-start"), stop = $("#vc-stop");
  if (start) start.textContent = words.start;
  if (stop) stop.textContent = words.stop;
  const question = $("#vc-question textarea");
  if (question) question.placeholder = words.ask;
  if (state.wantRunning) lockPickers(true);  // their tooltip names the Stop button
}

// The pickers a running source was opened with are greyed until it stops;
// each says why, and what to do, where a greyed control would otherwise not.
export function lockPickers(running) {
  const why = `Fixed while live: press “${sourceWords().stop}”, change it, then start again.`;
  for (const sel of FIXED_WHILE_LIVE) {
    const el = $(sel);
    if (!el) continue;
    el.disabled = running;
    for (const target of [el, el.closest("label")]) {
      if (!target) continue;
      if (running) target.title = why;
      else target.removeAttribute("title");
    }
  }
}

document.addEventListener("change", (e) => { if (e.target.closest?.("#vc-source")) showSourceWords(); });
whenShown("#vc-start").then(showSourceWords);
whenShown("#vc-question textarea").then(showSourceWords);
whenShown("#vc-stop-answer").then((button) => { button.title = STOP_ANSWER_SAYS; });
