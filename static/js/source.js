// Sources (camera, screen, a file) and the file's clock: where the file is
// goes to the server as pause, seek, loop and drift move it
// (vidchat/media/clock.py places the frames by it).
import { authHeaders } from "./api.js";
import { $, setNote, state } from "./state.js";

export function selectedConstraints() {
  const [w, h] = ($("#vc-res")?.value || "640x480").split("x").map(Number);
  const fps = Number($("#vc-fps")?.value || 15);
  const cam = $("#vc-camera")?.value;
  const mic = $("#vc-mic")?.value;
  return {
    video: { width: { ideal: w }, height: { ideal: h }, frameRate: { ideal: fps, max: fps },
             ...(cam ? { deviceId: { exact: cam } } : {}) },
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true,
             ...(mic ? { deviceId: { exact: mic } } : {}) },
  };
}

export function sourceKind() {
  return $("#vc-source")?.value || "camera";
}

// A stream of the server's --stream, chosen as "stream:NAME": the server reads
// it and brings its frames; the tab sends only its microphone, if any.
export function streamName(kind = sourceKind()) {
  return kind.startsWith("stream:") ? decodeURIComponent(kind.slice(7)) : "";
}

// A listing fetched again as its picker is about to open: at most one fetch
// at a time, whoever asks meanwhile waits for that one.
function oneAtATime(fetchList) {
  let running = null;
  return () => {
    if (!running) running = fetchList().finally(() => { running = null; });
    return running;
  };
}

// The server's streams join the Source menu, listed again as it is about to open.
export const listStreams = oneAtATime(fetchStreams);
async function fetchStreams() {
  const sel = $("#vc-source");
  if (!sel) return;
  try {
    const r = await fetch("/api/streams", { cache: "no-store", headers: authHeaders() });
    if (!r.ok) return;
    for (const s of await r.json()) {
      const value = `stream:${encodeURIComponent(s.name)}`;
      if ([...sel.options].some((o) => o.value === value)) continue;
      const option = document.createElement("option");
      option.value = value;
      option.textContent = `Stream: ${s.name}`;
      sel.append(option);
    }
  } catch (_) { /* the list is optional */ }
}
for (const type of ["focusin", "pointerdown"]) {
  document.addEventListener(type, (e) => { if (e.target?.closest?.("#vc-source")) listStreams(); }, true);
}

// A video file plays in the preview itself (its own controls pause, seek and
// loop it) and the element's captured stream goes over the same peer as a
// camera would: same filter, buffer and sampling.
export async function openFile() {
  const video = $("#vc-preview");
  const picked = $("#vc-file")?.files?.[0];
  if (!state.fileUrl && picked) {
    // Chosen before this script was listening (a page still loading): take it now.
    state.fileUrl = URL.createObjectURL(picked);
    state.fileName = picked.name;
  }
  if (!state.fileUrl) throw new Error("Choose a video file below the preview first.");
  if (!video.captureStream) throw new Error("This browser cannot send a playing video (no captureStream).");
  video.srcObject = null;
  if (video.src !== new URL(state.fileUrl, location.href).href) video.src = state.fileUrl;
  Object.assign(video, { loop: true, controls: true, muted: false });
  watchPresented(video);
  await video.play();
  const captured = video.captureStream();
  if (!captured.getVideoTracks().length) {
    await new Promise((resolve) => {
      captured.addEventListener("addtrack", resolve, { once: true });
      setTimeout(resolve, 2000);
    });
  }
  if (!captured.getVideoTracks().length) throw new Error("The file has no video track this browser can play.");
  return captured;
}

// The server stamps a file's frames by arrival, as a camera's. The file also
// has its own clock, which pause, seek, loop and rate move: tell the server
// where the file is whenever that clock jumps or stops, and every second
// while it plays (to absorb drift), so each answer's record says where in
// the file its frames and audio came from. Each report is read at its
// event and carries that moment (`at`, this page's clock): the video it
// describes reaches the server later than the report (encoding, RTP), so
// the server places the report among the frames by their capture times
// (vidchat/doors/webrtc.py; tests/test_page.py prints the offsets on a seek).
// Reports go one at a time, in order.
export function reportSource(jump) {
  if (!state.sessionId || !state.source || streamName(state.source)) return;  // a stream's source is the server's
  if (!jump) jump = presentedNow();
  const body = { session_id: state.sessionId, kind: state.source,
                 at: jump ? jump.at : performance.timeOrigin + performance.now() };
  if (state.source === "file") {
    const video = $("#vc-preview");
    if (!video) return;
    const rate = video.playbackRate;
    const seeking = video.seeking && !jump;
    Object.assign(body, {
      name: state.fileName || null,
      // While seeking, currentTime is already the target but the picture
      // still shows the last frame presented (under load, for a while):
      // that frame stands still until the target's first frame is
      // presented, which the frame callback reports (watchPresented).
      position: Math.max(0, jump ? jump.position
        : (seeking && presented.mediaTime !== null ? presented.mediaTime : video.currentTime || 0)),
      // Seeking or stalled for data (readyState < 3), the picture stands still, as when paused.
      playing: jump ? !video.paused && rate > 0
        : !video.paused && !video.seeking && !video.ended && video.readyState >= 3 && rate > 0,
      rate: rate > 0 ? Math.min(rate, 16) : 1,
      duration: Number.isFinite(video.duration) && video.duration > 0 ? video.duration : null,
      loop: !!video.loop,
    });
  }
  if (state.source === "file") state.fileClock = body;  // what the server extrapolates from
  state.reports.push(body);
  if (state.reports.length > 32) state.reports.shift();  // a stalled server: keep the newest
  sendReports();
}

// The preview's newest presented frame (its place in the file), and the
// target of a seek whose first frame has not been presented yet. A seek's
// jump is reported just before that frame's presentation: a report at
// "seeking" would give the target's position to old pictures still
// captured after it, and one at "seeked" the old position to the target's
// first frame, which Chromium captures just before "seeked" fires. Its
// capture can also come a little before its presentation time (a starved
// tab in a two-worker test run: the target's first frame kept the old
// position with a report 1 ms before it), so the report goes up to
// SEEK_LEAD_MS earlier. An old picture's capture can come late too (a
// clean run placed the last old frame, shown 1 ms before such a report,
// among the new ones), so the report goes at most halfway back to the last
// old picture's presentation: a capture that strays either way by less
// than half the gap between the two pictures gets the right position.
const presented = { mediaTime: null, at: null, previousAt: null, seekTarget: null };
const SEEK_LEAD_MS = 100;

// A playing file's place, read from its newest presented frame (the frame
// and the moment it was shown) rather than from currentTime and now: a
// starved tab's currentTime can lag the picture, and one such report put
// the frames after it 0.36 s before their place in the file. Null where
// that frame is not known, older than the last report, or the file is
// not simply playing (paused, seeking, stalled: the picture stands still).
function presentedNow() {
  const video = $("#vc-preview");
  if (state.source !== "file" || !video || presented.at === null || presented.mediaTime === null) return null;
  if (video.paused || video.seeking || video.ended || video.readyState < 3 || !(video.playbackRate > 0)) return null;
  const now = performance.timeOrigin + performance.now();
  if (now - presented.at > 1000 || (state.fileClock && presented.at <= state.fileClock.at)) return null;
  return { position: presented.mediaTime, at: presented.at };
}
function watchPresented(video) {
  if (!video.requestVideoFrameCallback || video.dataset.vcPresented) return;
  video.dataset.vcPresented = "1";
  const onFrame = (_now, meta) => {
    presented.previousAt = presented.at;
    presented.mediaTime = meta.mediaTime;
    presented.at = performance.timeOrigin + meta.presentationTime;  // this page's clock, as reports
    const target = presented.seekTarget;
    if (target !== null && Math.abs(meta.mediaTime - target) < 0.25) {
      presented.seekTarget = null;
      if (state.source === "file") {
        // Placed earlier, a playing file's position is where it then was
        // (the server extrapolates it forward to this frame); a paused
        // one's picture stands where it is.
        const rate = !video.paused && video.playbackRate > 0 ? video.playbackRate : 0;
        const gap = presented.previousAt === null ? Infinity : presented.at - presented.previousAt;
        const lead = Math.min(SEEK_LEAD_MS, gap / 2, rate ? meta.mediaTime / rate * 1000 : Infinity);
        const at = presented.at - lead;
        reportSource({ position: meta.mediaTime - (presented.at - at) / 1000 * rate, at });
      }
    } else {
      // The seek ended on another frame (a starved tab skips frames; a
      // loop's first frames can go unseen): the drift check below reports
      // where the picture really is.
      if (target !== null && !video.seeking) presented.seekTarget = null;
      if (presented.seekTarget === null && state.source === "file") reportDrift();
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}

// Between reports the server extrapolates the file's position from the
// last one by the wall clock, or holds it where a report said the picture
// stands (paused, seeking, stalled). A starved tab's video stalls, then
// skips ahead to catch up with its audio: in a two-worker test run a
// frame was placed 0.36 s before where it is in the file, between two of
// the once-a-second reports; and at a loop the "seeked" report, made
// before the file had data again, said the picture stood at 0 s while it
// played on (a frame 0.65 s in was placed at 0). So a presented frame
// that is further than DRIFT_S from where the last report puts it is
// reported at once, at its presentation (at most every DRIFT_EVERY_MS).
const DRIFT_S = 0.15, DRIFT_EVERY_MS = 300;
let lastDriftReport = 0;
function reportDrift() {
  const clock = state.fileClock, at = presented.at, video = $("#vc-preview");
  if (!clock || !video || video.paused || video.seeking || at <= clock.at || at - lastDriftReport < DRIFT_EVERY_MS) {
    return;  // (a frame presented before the last report: that report is newer news)
  }
  const expected = clock.playing ? clock.position + (at - clock.at) / 1000 * clock.rate : clock.position;
  let off = presented.mediaTime - expected;
  if (clock.loop && clock.duration) {  // a position past the end has wrapped: compare on the circle
    off = ((off % clock.duration) + clock.duration * 1.5) % clock.duration - clock.duration / 2;
  }
  // A picture the last report has standing still that moves at all has started to play.
  if (Math.abs(off) <= (clock.playing ? DRIFT_S : 0.02)) return;
  lastDriftReport = at;
  reportSource({ position: presented.mediaTime, at: at - 1 });
}

function sendReports() {
  if (state.reporting || !state.reports.length) return;
  state.reporting = true;
  fetch("/webrtc/source", { method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
                            body: JSON.stringify(state.reports.shift()) })
    .catch(() => {})
    .finally(() => { state.reporting = false; sendReports(); });
}

// Media events do not bubble, so listen while they travel down (capture).
for (const type of ["play", "playing", "pause", "seeking", "seeked", "ratechange", "waiting", "ended"]) {
  document.addEventListener(type, (e) => {
    if (e.target?.id !== "vc-preview" || state.source !== "file" || !state.wantRunning) return;
    if (type === "seeking" && e.target.requestVideoFrameCallback) presented.seekTarget = e.target.currentTime;
    reportSource();
  }, true);
}

export function leaveFile() {
  const video = $("#vc-preview");
  if (!video || !video.getAttribute("src")) return;
  video.pause();
  video.removeAttribute("src");
  Object.assign(video, { controls: false, muted: true });
  video.load();
}

// The video track of a source: the camera, or a shared screen, window or tab.
export async function openVideo(kind, c) {
  if (kind === "file") return (await openFile()).getVideoTracks()[0];
  if (kind === "screen") {
    if (!navigator.mediaDevices?.getDisplayMedia) throw new Error("This browser cannot share a screen here.");
    const shared = await navigator.mediaDevices.getDisplayMedia({
      video: { frameRate: c.video.frameRate, width: c.video.width, height: c.video.height }, audio: false,
    });
    return shared.getVideoTracks()[0];
  }
  return (await navigator.mediaDevices.getUserMedia({ video: c.video })).getVideoTracks()[0];
}

export function watchScreenEnd(track) {
  // The browser's own "Stop sharing" button ends the track: say so; the
  // session (and its chat) stays until another source is chosen or it idles out.
  track.addEventListener("ended", () => {
    if (state.stream?.getVideoTracks()[0] === track && state.wantRunning) {
      setNote("Screen sharing stopped. Pick a source to continue this session.");
    }
  });
}

// Ask for both; if one is refused or missing, run with what was granted.
export async function openMedia() {
  const c = selectedConstraints();
  // A stream of its own, not the captured one: the element owns that one and
  // drops whatever is added to it when its source changes, which ended the
  // camera's tracks on a switch from a file back to the camera.
  if (sourceKind() === "file") return { stream: new MediaStream((await openFile()).getTracks()), note: "" };
  leaveFile();
  if (streamName()) {
    const said = `The server reads the stream “${streamName()}”: its frames show in the live strip.`;
    try {
      return { stream: await navigator.mediaDevices.getUserMedia({ audio: c.audio }), note: said };
    } catch (_) {
      return { stream: new MediaStream(), note: `${said} (No microphone: the model gets the stream alone.)` };
    }
  }
  if (sourceKind() === "screen") {
    let video;
    try {
      video = await openVideo("screen", c);
    } catch (err) {
      throw new Error(`Screen sharing was refused or is unavailable (${err.name || err}). Pick Camera, or allow sharing.`);
    }
    watchScreenEnd(video);
    try {
      const mic = (await navigator.mediaDevices.getUserMedia({ audio: c.audio })).getAudioTracks()[0];
      return { stream: new MediaStream([video, mic]), note: "" };
    } catch (_) {
      return { stream: new MediaStream([video]), note: "Microphone unavailable: the model gets the screen only." };
    }
  }
  try {
    return { stream: await navigator.mediaDevices.getUserMedia(c), note: "" };
  } catch (both) {
    const tries = [
      [{ video: c.video }, "Microphone unavailable: the model gets frames only."],
      [{ audio: c.audio }, "Camera unavailable: the model gets audio only, so questions will be refused until frames arrive."],
    ];
    for (const [constraints, note] of tries) {
      try {
        return { stream: await navigator.mediaDevices.getUserMedia(constraints), note };
      } catch (_) { /* try the next */ }
    }
    throw new Error(`Camera and microphone were refused or are missing (${both.name}). ` +
                    "Allow access in the browser's site settings and press Start again.");
  }
}

export async function fillDeviceLists() {
  if (!navigator.mediaDevices?.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  for (const [kind, sel] of [["videoinput", "#vc-camera"], ["audioinput", "#vc-mic"]]) {
    const el = $(sel);
    if (!el) continue;
    const current = el.value;
    const list = devices.filter((d) => d.kind === kind);
    el.innerHTML = '<option value="">Default</option>' +
      list.map((d, i) => `<option value="${d.deviceId}">${(d.label || `${kind} ${i + 1}`).replace(/</g, "&lt;")}</option>`).join("");
    el.value = list.some((d) => d.deviceId === current) ? current : "";
  }
}

// The server's --media-dir, listed again each time the picker is about to
// open (focus, a press) or the file source is chosen: a file added there
// shows without reloading the page. The choice made stays chosen.
export const listServerMedia = oneAtATime(fetchServerMedia);
async function fetchServerMedia() {
  const sel = $("#vc-media");
  if (!sel) return;
  try {
    const r = await fetch("/api/media", { cache: "no-store", headers: authHeaders() });
    const files = r.ok ? (await r.json()).files : [];
    const names = files.map((f) => encodeURIComponent(f.name));
    const listed = [...sel.options].map((o) => o.value).filter(Boolean);
    if (listed.length && listed.join("/") === names.join("/")) return;  // unchanged: an open picker stays open
    const chosen = sel.value;
    sel.innerHTML = files.length
      ? '<option value="">choose…</option>' + files.map((f, i) =>
          `<option value="${names[i]}">${f.name.replace(/</g, "&lt;")}</option>`).join("")
      : '<option value="">(none: the server has no --media-dir)</option>';
    sel.value = names.includes(chosen) ? chosen : "";
  } catch (_) { /* the list is optional */ }
}
for (const type of ["focusin", "pointerdown"]) {
  document.addEventListener(type, (e) => { if (e.target?.closest?.("#vc-media")) listServerMedia(); }, true);
}
