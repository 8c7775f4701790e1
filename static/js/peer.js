// The peer: the WebRTC connection to the server's session, its resume after
// a network blip, switching sources on it, Start and Stop.
import { accessMode, authHeaders, beaconUrl, loginProblem, pageToken } from "./api.js";
import { renderStats, startStatsPolling, stopStatsPolling } from "./live.js";
import {
  fillDeviceLists, leaveFile, listStreams, openFile, openMedia, openVideo, reportSource, selectedConstraints,
  sourceKind, streamName, watchScreenEnd,
} from "./source.js";
import { $, forgetResume, keepResume, publishSessionId, setNote, setStatus, state } from "./state.js";
import { lockPickers } from "./wording.js";

const MAX_RECONNECTS = 4;

async function iceConfig() {
  if (accessMode() !== "none" && !pageToken()) {
    throw new Error(loginProblem(401));
  }
  const r = await fetch("/api/config", { cache: "no-store", headers: authHeaders() });
  if (!r.ok) {
    // A 503 carries the server's reason (e.g. TURN credentials it could not mint).
    const detail = await r.json().then((b) => b.detail).catch(() => null);
    throw new Error(loginProblem(r.status) || detail || `server config unavailable (${r.status})`);
  }
  return r.json();
}

async function connect(resume) {
  const cfg = await iceConfig();
  const pc = new RTCPeerConnection({ iceServers: cfg.iceServers || [] });
  state.pc = pc;
  for (const track of state.stream.getTracks()) pc.addTrack(track, state.stream);
  const stream = streamName(state.source);
  if (!state.stream.getTracks().length) pc.createDataChannel("vidchat");  // a stream without a microphone
  pc.addEventListener("connectionstatechange", () => onConnectionState(pc));
  await pc.setLocalDescription(await pc.createOffer());
  await waitForIce(pc);
  const r = await fetch("/webrtc/offer", {
    method: "POST",
    headers: authHeaders({ "Content-Type": "application/json" }),
    body: JSON.stringify({
      sdp: pc.localDescription.sdp, type: "offer",
      ...(stream ? { stream } : {}),
      ...(resume && state.sessionId ? { resume: { session_id: state.sessionId, token: state.resumeToken } } : {}),
    }),
  });
  if (!r.ok) {
    const detail = await r.json().catch(() => ({}));
    const err = new Error(loginProblem(r.status) || detail.detail || `the server refused the connection (${r.status})`);
    err.retry = r.status === 503;  // full: a place may free up
    throw err;
  }
  const answer = await r.json();
  if (pc !== state.pc) {  // stopped (or restarted) meanwhile: end what the server just set up
    pc.close();
    if (!answer.resumed) navigator.sendBeacon(beaconUrl("/webrtc/close"), JSON.stringify({ session_id: answer.session_id }));
    return;
  }
  if (resume && !answer.resumed) {
    setNote("The previous session had ended (the chat above said why); this is a new one with an empty chat and buffer.");
  }
  state.resumeToken = answer.resume_token || "";
  publishSessionId(answer.session_id);
  keepResume();
  reportSource();
  await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });
}

// Without trickle ICE the offer must carry the candidates; wait (briefly) for them.
function waitForIce(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", done); resolve(); } };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, 3000);
  });
}

function onConnectionState(pc) {
  if (pc !== state.pc) return;
  const s = pc.connectionState;
  if (s === "connected") {
    // A stream's badge is its reader's state, from the stats (static/js/live.js).
    if (streamName(state.source)) setStatus("Connecting to the stream…", "busy");
    else setStatus("Live", "live");
  } else if (s === "connecting" || s === "new") {
    setStatus("Connecting…", "busy");
  } else if (s === "disconnected") {
    setStatus("Connection interrupted, waiting…", "busy");
  } else if (s === "failed" && state.wantRunning) {
    reconnect();
  }
}

// A network blip: get a new peer for the same server session (same
// buffer, same chat) with back-off. Stop (or a new Start) ends the loop,
// also while it waits.
export async function reconnect() {
  if (state.reconnecting) return;
  state.reconnecting = true;
  const run = state.run;
  const current = () => run === state.run && state.wantRunning;
  try {
    for (let attempt = 1; attempt <= MAX_RECONNECTS && current(); attempt++) {
      setStatus(`Reconnecting (try ${attempt} of ${MAX_RECONNECTS})…`, "busy");
      try { state.pc?.close(); } catch (_) {}
      state.pc = null;
      await new Promise((r) => setTimeout(r, 1000 * 2 ** (attempt - 1)));
      if (!current()) return;
      try {
        await connect(true);
        if (current()) return;
      } catch (err) {
        setNote(`Reconnect failed: ${err.message || err}`);
      }
    }
    if (current()) {
      setStatus("Connection failed", "error");
      setNote("Could not reach the server over WebRTC. On a hosted server this usually needs a TURN server (--ice-servers). Press Start to try again.");
      await stop(true);
    }
  } finally {
    state.reconnecting = false;
  }
}

// A new source on the same peer: replaceTrack needs no renegotiation, so the
// server session, its buffer and the chat carry on.
export async function switchSource() {
  if (!state.wantRunning || !state.pc || !state.stream) return;
  if (streamName() || streamName(state.source)) {
    await switchStream();
    return;
  }
  const sender = state.pc.getSenders().find((s) => s.track?.kind === "video");
  if (!sender) {
    setNote("This session started without video; press Stop and Start to use another source.");
    return;
  }
  const kind = sourceKind();
  let track, audio = null;
  try {
    if (kind === "file") {
      const captured = await openFile();
      track = captured.getVideoTracks()[0];
      audio = captured.getAudioTracks()[0] || null;
    } else {
      if (state.source === "file") leaveFile();
      track = await openVideo(kind, selectedConstraints());
      if (state.source === "file") {  // back from a file: the microphone again
        audio = (await navigator.mediaDevices.getUserMedia({ audio: selectedConstraints().audio })
          .catch(() => null))?.getAudioTracks()[0] || null;
      }
    }
  } catch (err) {
    setNote(`Could not switch source: ${err.message || err.name || err}`);
    return;
  }
  if (kind === "screen") watchScreenEnd(track);
  await sender.replaceTrack(track);
  state.rateWindow = null;  // the new source's rate is measured afresh
  const audioSender = state.pc.getSenders().find((s) => s.track?.kind === "audio" || s.track === null);
  if (audio && audioSender) await audioSender.replaceTrack(audio);
  const olds = [state.stream.getVideoTracks()[0], ...(audio ? state.stream.getAudioTracks() : [])];
  for (const old of olds) { if (old) { state.stream.removeTrack(old); if (state.source !== "file") old.stop(); } }
  state.stream.addTrack(track);
  if (audio) state.stream.addTrack(audio);
  state.source = kind;
  reportSource();  // later frames are the new source's (a camera's have no file position)
  const video = $("#vc-preview");
  if (video && kind !== "file") { video.srcObject = state.stream; video.play().catch(() => {}); }
  setNote(kind === "screen" ? "Now sharing the screen; the chat and buffer carry on."
          : kind === "file" ? "Now playing the file; the chat and buffer carry on." : "");
}

// To or from a stream of the server: a new peer for the same session (its
// buffer and chat carry on), since what the tab sends changes.
async function switchStream() {
  const kind = sourceKind();
  try { state.pc?.close(); } catch (_) {}
  state.pc = null;
  state.stream?.getTracks().forEach((t) => t.stop());
  try {
    const { stream, note } = await openMedia();
    state.stream = stream;
    state.source = kind;
    const video = $("#vc-preview");
    if (video && kind !== "file") { video.srcObject = stream; video.play().catch(() => {}); }
    state.rateWindow = null;
    await connect(true);
    setNote(`${note ? note + " " : ""}The chat and buffer carry on.`);
  } catch (err) {
    setNote(`Could not switch source: ${err.message || err.name || err}`);
  }
}

// resume: come back to this tab's session (state.sessionId, after a reload).
export async function start(resume = false) {
  if (state.wantRunning) return;
  if (!navigator.mediaDevices?.getUserMedia) {
    setStatus("Unavailable", "error");
    setNote("This browser cannot capture media here. Use a current browser, on https:// or http://localhost.");
    return;
  }
  state.wantRunning = true;
  state.run += 1;
  toggleButtons(true);
  setStatus("Starting…", "busy");
  setNote("");
  try {
    const { stream, note } = await openMedia();
    state.stream = stream;
    const video = $("#vc-preview");
    if (video && sourceKind() !== "file") { video.srcObject = stream; video.play().catch(() => {}); }
    state.source = sourceKind();
    setNote(note);
    fillDeviceLists().catch(() => {});
    setStatus("Connecting…", "busy");
    // After Stop the tab still holds its session (paused): Start carries on with it.
    await connect(resume === true || Boolean(state.sessionId));
    startStatsPolling(() => stop(true, true));
  } catch (err) {
    setStatus(err.retry ? "Server full" : "Not running", "error");
    await stop(true);
    setNote(err.message || String(err), err.retry ? start : null);
  }
}

export const PAUSED_STATS = "Stopped: this session, its chat and its kept frames wait for Start";

// Stop pauses: the source and the peer end, the session (its chat, kept
// answers and frames) waits for the next Start. ended: the server already
// ended the session, so the tab lets go of it too.
export async function stop(keepNote, ended = false) {
  state.wantRunning = false;
  state.run += 1;
  stopStatsPolling();
  const sid = state.sessionId;
  try { state.pc?.close(); } catch (_) {}
  state.pc = null;
  state.stream?.getTracks().forEach((t) => t.stop());
  state.stream = null;
  leaveFile();
  const video = $("#vc-preview");
  if (video) video.srcObject = null;
  toggleButtons(false);
  const paused = sid && !ended ? await pause(sid) : false;
  if (!paused) {
    publishSessionId("");
    state.resumeToken = "";
    forgetResume();
  }
  if (!keepNote) {
    setStatus("Stopped", "idle");
    setNote(paused ? "The chat and what the model got stay; Start carries on with them." : "");
  }
  renderStats(null, paused ? PAUSED_STATS : undefined);
}

// Tells the server this tab keeps its session without media (Stop, or a
// stopped tab reloaded); false when the session has ended meanwhile.
export async function pause(sid) {
  try {
    const r = await fetch("/webrtc/close", { method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
                                             body: JSON.stringify({ session_id: sid, pause: true }) });
    if (!r.ok) return false;
    keepResume(true);
    return true;
  } catch (_) {
    return false;
  }
}

function toggleButtons(running) {
  const startBtn = $("#vc-start"), stopBtn = $("#vc-stop");
  if (startBtn) startBtn.disabled = running;
  if (stopBtn) stopBtn.disabled = !running;
  lockPickers(running);
}
