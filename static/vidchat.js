// vidchat's browser client: camera + microphone -> RTCPeerConnection -> server.
// The page's markup comes from vidchat/doors/page/layout.py; these modules
// only add behaviour, one concern each (static/js/): the credential (api),
// sources and the file's clock (source), the peer with resume (peer), the
// live figures (live), Talk (talk), typed questions (questions) with the
// settings they carry (settings), the chat drawn from the session's events
// (chat), readiness (ready) and the words that follow the source (wording).
// The session id the server returns is written into a hidden Gradio
// textbox, so every Gradio event (Stop, Clear, Watch, Talk, re-ask) carries
// its own tab's session. window.vidchat is the surface tests and QA scripts read.
import { beaconUrl, pageToken } from "./js/api.js";
import { counts, questions } from "./js/chat.js";
import { PAUSED_STATS, pause, reconnect, start, stop, switchSource } from "./js/peer.js";
import { renderStats } from "./js/live.js";
import "./js/questions.js";
import "./js/ready.js";
import "./js/suites.js";
import "./js/suite_panel.js";
import { listServerMedia, listStreams, sourceKind } from "./js/source.js";
import { $, publishSessionId, resumeAfterReload, setNote, state, whenShown } from "./js/state.js";
import { talk } from "./js/talk.js";

function fileChosen(url, name) {
  state.fileUrl = url;
  state.fileName = name || "";
  if (state.wantRunning && sourceKind() === "file") switchSource();
}

// The file row shows exactly while the Source menu says "file".
function syncFileRow() {
  const row = $("#vc-file-row");
  if (row) row.hidden = sourceKind() !== "file";
}

document.addEventListener("change", (e) => {
  if (e.target.closest?.("#vc-source")) {
    syncFileRow();
    if (sourceKind() === "file") {
      listServerMedia();
      if (!state.fileUrl) { setNote("Choose a video file below the preview."); return; }
    }
    switchSource();
  } else if (e.target.closest?.("#vc-file")) {
    const file = e.target.files?.[0];
    if (file) fileChosen(URL.createObjectURL(file), file.name);
  } else if (e.target.closest?.("#vc-media")) {
    const name = e.target.value;
    const token = pageToken();
    if (name) fileChosen(`/media/${name}${token ? `?token=${encodeURIComponent(token)}` : ""}`, decodeURIComponent(name));
  }
});
document.addEventListener("click", (e) => {
  if (e.target.closest("#vc-start")) start();
  else if (e.target.closest("#vc-stop")) stop();
});

// Leaving the page ends the server's peer at once instead of after ICE
// times out; the session waits a few seconds for this tab to come back (a
// reload), then ends (vidchat/doors/webrtc_routes.py RELOAD_GRACE_S).
window.addEventListener("pagehide", () => {
  if (state.sessionId) {
    navigator.sendBeacon(beaconUrl("/webrtc/close"),
                         JSON.stringify({ session_id: state.sessionId, reload_grace: true }));
  }
});

// The server's streams (--stream) join the Source menu once it is on the page;
// a source chosen before this script listened shows its file row.
whenShown("#vc-source").then(() => {
  listStreams();
  syncFileRow();
});

// Start is disabled in the markup until this script can act on it: a press
// before it loaded (its modules are several requests) would do nothing.
whenShown("#vc-start").then((button) => {
  if (!state.wantRunning) button.disabled = false;
  button.removeAttribute("title");
});

// A reloaded tab that was running comes back to its session: the same
// buffer, and the chat as the server keeps it (vidchat/doors/page/chat.py).
const before = resumeAfterReload();
if (before) {
  Promise.all([whenShown("#vc-start"), whenShown("#vidchat-session-id")]).then(async () => {
    Object.assign(state, { sessionId: before.id, resumeToken: before.token });
    if (!before.paused) { start(true); return; }
    // Stopped before the reload: claim the session again (the server would
    // end it after the reload grace), and show its chat; Start carries on.
    if (await pause(before.id)) {
      publishSessionId(before.id);
      renderStats(null, PAUSED_STATS);
      setNote("The chat and what the model got stay; Start carries on with them.");
    } else {
      Object.assign(state, { sessionId: "", resumeToken: "" });
    }
  });
}

window.vidchat = {
  start, stop, switchSource,
  get sessionId() { return state.sessionId; },
  // Talk mode's state: status, and every text handed to speech synthesis.
  get talk() { return { status: talk.status, spoken: [...talk.spoken], speaking: talk.speaking,
                        muted: talk.muted, on: talk.on }; },
  // Diagnostics: drop the peer as a network failure would, to see (and
  // test) that the tab re-attaches to its session.
  simulateNetworkDrop() { if (state.pc) { state.pc.close(); reconnect(); } },
  // Diagnostics: whether a reconnect loop (with its back-off wait) is still under way.
  get reconnecting() { return Boolean(state.reconnecting); },
  // Diagnostics: typed questions asked, and those whose outcome the chat
  // shows (static/js/chat.js): equal counts mean no typed question is still being answered.
  questions,
  // Diagnostics: Clear chat presses, each counted once its empty chat is shown (static/js/chat.js).
  get clears() { return counts.clears; },
  // Diagnostics: the candidate types of the pair ICE chose, e.g.
  // {local: "relay", remote: "host"} when media goes through a TURN relay.
  async selectedPair() {
    if (!state.pc) return null;
    const stats = [...(await state.pc.getStats()).values()];
    const byId = new Map(stats.map((s) => [s.id, s]));
    const transport = stats.find((s) => s.type === "transport" && s.selectedCandidatePairId);
    const pair = transport ? byId.get(transport.selectedCandidatePairId)
      : stats.find((s) => s.type === "candidate-pair" && s.nominated && s.state === "succeeded");
    if (!pair) return null;
    return { local: byId.get(pair.localCandidateId)?.candidateType,
             remote: byId.get(pair.remoteCandidateId)?.candidateType };
  },
};
