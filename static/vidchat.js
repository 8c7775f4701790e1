// vidchat's browser client: camera + microphone -> RTCPeerConnection -> server.
// The page's markup comes from vidchat/doors/page/layout.py; this file only adds behaviour.
// The session id the server returns is written into a hidden Gradio textbox,
// so every chat question carries its own tab's session.
(() => {
  "use strict";

  const state = {
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
  const MAX_RECONNECTS = 4;
  const RATE_WINDOW_MS = 3000; // the status line's fps and % kept: over about the last 3 s

  const $ = (sel) => document.querySelector(sel);

  function setStatus(text, tone) {
    const el = $("#vc-conn");
    if (!el) return;
    el.textContent = text;
    el.dataset.tone = tone || "idle";
  }

  function setNote(text, retry) {
    const el = $("#vc-note");
    if (!el) return;
    el.textContent = text || "";
    if (retry) {
      const btn = document.createElement("button");
      btn.className = "vc-btn vc-retry";
      btn.textContent = "Try again";
      btn.addEventListener("click", () => start());
      el.append(" ", btn);
    }
  }

  // The credential this page got when its user logged in (vidchat/app/access.py);
  // empty when the server asks for none.
  function pageToken() {
    const box = document.querySelector("#vidchat-page-token textarea, #vidchat-page-token input");
    return box ? box.value : "";
  }

  function authHeaders(extra) {
    const token = pageToken();
    return { ...(extra || {}), ...(token ? { Authorization: `Bearer ${token}` } : {}) };
  }

  // sendBeacon cannot set headers: the token rides in the query (the server
  // keeps it out of its access log).
  function beaconUrl(path) {
    const token = pageToken();
    return token ? `${path}?token=${encodeURIComponent(token)}` : path;
  }

  function accessMode() {
    return $("#vc-live-access")?.dataset.mode || "none";
  }

  function loginProblem(status) {
    if (status === 401 || status === 403) {
      return accessMode() === "hf"
        ? "Sign in with Hugging Face (top of the page) to start the camera."
        : "Your login is missing or has expired: reload the page and log in again.";
    }
    return "";
  }

  // Gradio listens to `input` events; a plain `.value =` would not reach the server.
  function publishSessionId(id) {
    state.sessionId = id;
    const box = document.querySelector("#vidchat-session-id textarea, #vidchat-session-id input");
    if (!box) return;
    const proto = box.tagName === "TEXTAREA" ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, "value").set.call(box, id);
    box.dispatchEvent(new Event("input", { bubbles: true }));
  }

  function selectedConstraints() {
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

  function sourceKind() {
    return $("#vc-source")?.value || "camera";
  }

  // A video file plays in the preview itself (its own controls pause, seek and
  // loop it) and the element's captured stream goes over the same peer as a
  // camera would: same filter, buffer and sampling.
  async function openFile() {
    const video = $("#vc-preview");
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
  function reportSource(jump) {
    if (!state.sessionId || !state.source) return;
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

  // Typing a question: the server warms this session's prompt at once
  // (vidchat/conversation/prewarm.py), so the answer starts sooner. At most every 1.5 s.
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
  // (vidchat/conversation/prewarm.py question_now). Listened for while the key travels
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
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || e.shiftKey || e.isComposing || !e.target?.closest?.("#vc-question")) return;
    questionAsked();
    if (!e.target.value?.trim()) return;
    questionSent();
  }, true);
  document.addEventListener("click", (e) => {
    if (e.target?.closest?.("#vc-send")) questionAsked();
  }, true);
  document.addEventListener("pointerdown", (e) => {
    if (e.target?.closest?.("#vc-send") && $("#vc-question textarea")?.value.trim()) questionSent();
  }, true);

  // Media events do not bubble, so listen while they travel down (capture).
  for (const type of ["play", "playing", "pause", "seeking", "seeked", "ratechange", "waiting", "ended"]) {
    document.addEventListener(type, (e) => {
      if (e.target?.id !== "vc-preview" || state.source !== "file" || !state.wantRunning) return;
      if (type === "seeking" && e.target.requestVideoFrameCallback) presented.seekTarget = e.target.currentTime;
      reportSource();
    }, true);
  }

  function leaveFile() {
    const video = $("#vc-preview");
    if (!video || !video.getAttribute("src")) return;
    video.pause();
    video.removeAttribute("src");
    Object.assign(video, { controls: false, muted: true });
    video.load();
  }

  // The video track of a source: the camera, or a shared screen, window or tab.
  async function openVideo(kind, c) {
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

  function watchScreenEnd(track) {
    // The browser's own "Stop sharing" button ends the track: say so; the
    // session (and its chat) stays until another source is chosen or it idles out.
    track.addEventListener("ended", () => {
      if (state.stream?.getVideoTracks()[0] === track && state.wantRunning) {
        setNote("Screen sharing stopped. Pick a source to continue this session.");
      }
    });
  }

  // Ask for both; if one is refused or missing, run with what was granted.
  async function openMedia() {
    const c = selectedConstraints();
    // A stream of its own, not the captured one: the element owns that one and
    // drops whatever is added to it when its source changes, which ended the
    // camera's tracks on a switch from a file back to the camera.
    if (sourceKind() === "file") return { stream: new MediaStream((await openFile()).getTracks()), note: "" };
    leaveFile();
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

  async function fillDeviceLists() {
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
    pc.addEventListener("connectionstatechange", () => onConnectionState(pc));
    await pc.setLocalDescription(await pc.createOffer());
    await waitForIce(pc);
    const r = await fetch("/webrtc/offer", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({
        sdp: pc.localDescription.sdp, type: "offer",
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
      setNote("The server had already ended the old session (idle too long); this is a new one with an empty buffer.");
    }
    state.resumeToken = answer.resume_token || "";
    publishSessionId(answer.session_id);
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
      setStatus("Live", "live");
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
  async function reconnect() {
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
  async function switchSource() {
    if (!state.wantRunning || !state.pc || !state.stream) return;
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

  async function start() {
    if (state.wantRunning) return;
    if (!navigator.mediaDevices?.getUserMedia) {
      setStatus("Unavailable", "error");
      setNote("This browser cannot capture media here. Use a current browser, on https:// or http://localhost.");
      return;
    }
    state.wantRunning = true;
    state.run += 1;
    toggleButtons(true);
    setStatus("Starting camera…", "busy");
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
      await connect();
      startStatsPolling();
    } catch (err) {
      setStatus(err.retry ? "Server full" : "Not running", "error");
      await stop(true);
      setNote(err.message || String(err), err.retry);
    }
  }

  async function stop(keepNote) {
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
    if (sid) {
      fetch("/webrtc/close", { method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
                               body: JSON.stringify({ session_id: sid }) }).catch(() => {});
    }
    publishSessionId("");
    state.resumeToken = "";
    toggleButtons(false);
    if (!keepNote) { setStatus("Stopped", "idle"); setNote(""); }
    renderStats(null);
  }

  function toggleButtons(running) {
    const startBtn = $("#vc-start"), stopBtn = $("#vc-stop");
    if (startBtn) startBtn.disabled = running;
    if (stopBtn) stopBtn.disabled = !running;
    for (const sel of ["#vc-res", "#vc-fps", "#vc-camera", "#vc-mic"]) {
      const el = $(sel);
      if (el) el.disabled = running;
    }
  }

  // Stats every second, the live view every third time. The next poll is
  // set once this one has its answer: on a loaded machine, where an answer
  // can take longer than the interval, polls would otherwise pile up and
  // take the browser's few connections to the server from the questions.
  function startStatsPolling() {
    stopStatsPolling();
    const loop = {};
    state.statsLoop = loop;
    const tick = async () => {
      if (state.statsLoop !== loop) return;
      if (state.sessionId) {
        if (state.source === "file") reportSource();
        try {
          const r = await fetch(`/webrtc/stats?session_id=${encodeURIComponent(state.sessionId)}`,
                                { cache: "no-store", headers: authHeaders() });
          if (r.status === 404 && state.wantRunning) {
            const detail = (await r.json().catch(() => ({}))).detail || "";
            const why = detail.startsWith("session ended: ") ? detail.slice("session ended: ".length) : "";
            setStatus(why ? `Stopped: ${why.split(":")[0]}` : "Session ended by the server", "error");
            setNote(why ? `The server ended this session: ${why}. Press Start camera to begin again.`
                        : "The server closed this session (idle or restarted). Press Start again.");
            await stop(true);
            return;
          }
          if (r.ok) renderStats(await r.json());
          if (++state.ticks % 3 === 0) await refreshLiveView();
        } catch (_) { /* transient: next tick */ }
      }
      if (state.statsLoop === loop) state.statsTimer = setTimeout(tick, 1000);
    };
    state.statsTimer = setTimeout(tick, 1000);
  }

  // The live view: the newest kept frames, and a small chart of time to first
  // token (bars) and tokens/s (line) over the session's recent answers.
  async function refreshLiveView() {
    const view = $("#vc-live-view");
    if (!view || !state.sessionId) return;
    try {
      const r = await fetch(`/webrtc/live?session_id=${encodeURIComponent(state.sessionId)}`,
                            { cache: "no-store", headers: authHeaders() });
      if (!r.ok) return;
      const live = await r.json();
      view.hidden = false;
      $("#vc-kept").innerHTML = live.kept.map((f) =>
        `<figure><img src="${f.src}" alt="kept frame ${f.index}"><figcaption>#${f.index} · ${f.t.toFixed(1)} s</figcaption></figure>`).join("");
      drawChart(live.answers);
    } catch (_) { /* next tick */ }
  }

  // One slot per answer, at least CHART_SLOTS of them, so the first answer is
  // one bar among empty places, not a block filling the chart; the axis on
  // the left says what the top of the bars is.
  const CHART_SLOTS = 12;
  function drawChart(answers) {
    const svg = $("#vc-chart"), legend = $("#vc-chart-legend"), top = $("#vc-chart-top");
    if (!svg || !legend) return;
    const done = answers.filter((a) => a.ttft_ms != null);
    const box = svg.closest(".vc-chart-box");
    // No empty axis before there is anything to draw: just the sentence.
    if (box) box.hidden = !done.length;
    if (!done.length) {
      svg.innerHTML = ""; if (top) top.textContent = "";
      legend.textContent = "Answer timings appear after the first answer."; return;
    }
    const maxTtft = Math.max(...done.map((a) => a.ttft_ms), 1);
    const maxTps = Math.max(...done.map((a) => a.tokens_per_s || 0), 1);
    const w = 200 / Math.max(done.length, CHART_SLOTS);
    const h = (v, max) => (36 * v) / max;
    const bars = done.map((a, i) =>
      `<rect x="${i * w + w * 0.15}" y="${40 - h(a.ttft_ms, maxTtft)}" width="${w * 0.7}" height="${h(a.ttft_ms, maxTtft)}" class="vc-bar"><title>${Math.round(a.ttft_ms)} ms to first token</title></rect>`).join("");
    const pts = done.map((a, i) => `${i * w + w / 2},${40 - h(a.tokens_per_s || 0, maxTps)}`).join(" ");
    const grid = `<line x1="0" y1="4" x2="200" y2="4" class="vc-grid"/><line x1="0" y1="39.5" x2="200" y2="39.5" class="vc-axis"/>`;
    svg.innerHTML = grid + bars + (done.length > 1 ? `<polyline points="${pts}" class="vc-line" fill="none"/>` : "");
    if (top) top.textContent = `${Math.round(maxTtft)} ms`;
    const last = done[done.length - 1];
    legend.textContent = `Last answer: first token ${Math.round(last.ttft_ms)} ms, ` +
      `${(last.tokens_per_s || 0).toFixed(1)} tokens/s. Bars: time to first token of the last ${done.length} ` +
      `answer${done.length === 1 ? "" : "s"}, oldest on the left` +
      (done.length > 1 ? `; line: tokens/s, top ${maxTps.toFixed(1)}` : "");
  }

  function stopStatsPolling() {
    clearTimeout(state.statsTimer);
    state.statsTimer = null;
    state.statsLoop = null;
  }

  function renderStats(s) {
    const el = $("#vc-stats");
    if (!el) return;
    if (!s) {
      el.textContent = "No session";
      state.rateWindow = null;
      const view = $("#vc-live-view");
      if (view) view.hidden = true;
      return;
    }
    const m = s.media || {};
    const now = performance.now();
    const rates = [];
    // Rates over the last few seconds of samples, never over a moment: two
    // reports close together (a source switch, a restart) once showed
    // "11029.4 fps in". A counter that went back (a new session or track)
    // starts the window again; until it spans a second, no rate is shown.
    const seenNow = m.video_frames_seen ?? s.frames_received;
    let win = state.rateWindow;
    const newest = win && win.points[win.points.length - 1];
    if (!win || win.session !== state.sessionId || seenNow < newest.seen || s.frames_kept < newest.kept) {
      win = state.rateWindow = { session: state.sessionId, points: [] };
    }
    win.points.push({ at: now, seen: seenNow, kept: s.frames_kept });
    while (win.points.length > 2 && now - win.points[1].at >= RATE_WINDOW_MS) win.points.shift();
    const oldest = win.points[0];
    const dt = (now - oldest.at) / 1000;
    if (dt >= 1) {
      const seen = seenNow - oldest.seen;
      rates.push(`${(seen / dt).toFixed(1)} fps in`);
      if (seen > 0) rates.push(`${Math.round((100 * (s.frames_kept - oldest.kept)) / seen)} % kept`);
    }
    const parts = [...rates,
      `${m.video_frames_seen ?? s.frames_received} frames received`,
      `${s.frames_kept} kept by the filter`,
      `buffer ${s.frames_in_buffer}/${s.max_frames}`,
      ...(s.frame_size ? [`stored ${s.frame_size.replace("x", "×")}`] : []),
      `${(s.audio_seconds || 0).toFixed(1)} s audio`,
    ];
    if (m.lag_ms_p95 != null) parts.push(`lag p95 ${Math.round(m.lag_ms_p95)} ms`);
    for (const g of s.gpu || []) {  // on a GPU server only
      const gib = (n) => (n / 2 ** 30).toFixed(1);
      parts.push(`GPU${(s.gpu.length > 1) ? " " + g.gpu : ""} ${gib(g.memory_used_bytes)}/${gib(g.memory_total_bytes)} GiB, ` +
                 `${Math.round(100 * g.utilization_ratio)} % busy`);
    }
    if (s.time_left_s != null) {
      const left = Math.max(0, Math.round(s.time_left_s));
      parts.push(`session ends in ${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")}`);
    }
    el.textContent = parts.join(" · ");
    el.dataset.ending = s.time_left_s != null && s.time_left_s < 60 ? "soon" : "";
  }

  // The server's --media-dir, listed again each time the picker is about to
  // open (focus, a press) or the file source is chosen: a file added there
  // shows without reloading the page. The choice made stays chosen.
  let mediaListing = null;
  function listServerMedia() {
    if (!mediaListing) mediaListing = fetchServerMedia().finally(() => { mediaListing = null; });
    return mediaListing;
  }
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

  function fileChosen(url, name) {
    state.fileUrl = url;
    state.fileName = name || "";
    if (state.wantRunning && sourceKind() === "file") switchSource();
  }

  document.addEventListener("change", (e) => {
    if (e.target.closest?.("#vc-source")) {
      const row = $("#vc-file-row");
      if (row) row.hidden = sourceKind() !== "file";
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

  // ---- Talk mode: the server listens (vidchat/conversation/talk.py); this tab shows
  // what it hears and reads the answers aloud with the browser's own
  // speech synthesis (no server cost), stopping at once on barge-in or Stop.
  const talk = {
    on: false,
    run: 0,            // bumped by each Talk-on: the loop following the server's Talk state
    stream: null,      // that loop's request (aborted when Talk goes off)
    timer: null,
    muted: false,
    speechStarts: 0,
    answerN: -1,       // the answer being read aloud (its question number)
    spokenUpTo: 0,     // characters of it already handed to the synthesizer
    interrupted: -1,   // an answer stopped by barge-in or Stop: never resumed
    firstN: null,      // answers before Talk came on are not read
    speaking: false,
    spoken: [],        // every text handed to speechSynthesis.speak (diagnostics, tests)
    status: "off",
    playbackSent: false,
    guard: null,
  };
  const STATUS_TEXT = { off: "Talk is off", listening: "🟢 listening", hearing: "🎙 hearing you",
                        thinking: "💭 thinking", answering: "✍ answering", speaking: "🔊 speaking" };

  function showTalkStatus(status) {
    talk.status = status;
    const el = $("#vc-talk-status");
    if (el) { el.textContent = STATUS_TEXT[status] || status; el.dataset.state = status; }
  }

  function tellPlayback(on) {
    if (talk.playbackSent === on || !state.sessionId) return;
    talk.playbackSent = on;
    fetch("/webrtc/talk", { method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
                            body: JSON.stringify({ session_id: state.sessionId, speaking: on }) }).catch(() => {});
  }

  function stopSpeaking() {
    if (talk.answerN >= 0) talk.interrupted = talk.answerN;
    if (window.speechSynthesis) speechSynthesis.cancel();
    talk.speaking = false;
    tellPlayback(false);
  }

  function chosenVoice() {
    const name = $("#vc-voice")?.value;
    return name && window.speechSynthesis ? speechSynthesis.getVoices().find((v) => v.name === name) : null;
  }

  function speak(text) {
    text = text.trim();
    if (!text || talk.muted || !window.speechSynthesis) return;
    const u = new SpeechSynthesisUtterance(text);
    const voice = chosenVoice();
    if (voice) u.voice = voice;
    talk.spoken.push(text);
    talk.speaking = true;
    tellPlayback(true);
    const settle = () => {
      if (!speechSynthesis.speaking && !speechSynthesis.pending) { talk.speaking = false; tellPlayback(false); }
    };
    u.onend = u.onerror = () => setTimeout(settle, 0);
    // A browser without an audio device may never end an utterance: assume
    // it ended after a generous reading time.
    clearTimeout(talk.guard);
    talk.guard = setTimeout(() => { talk.speaking = false; tellPlayback(false); }, 2000 + text.length * 90);
    speechSynthesis.speak(u);
  }

  // Hand complete sentences to the synthesizer as the answer streams; the
  // rest when it is done.
  function readAloud(answer) {
    // The first poll after Talk came on sets what is new: answers from then on.
    if (talk.firstN === null) talk.firstN = !answer ? 0 : answer.done ? answer.n + 1 : answer.n;
    if (!answer || answer.n == null) return;
    if (answer.n < talk.firstN || answer.n === talk.interrupted) return;
    if (answer.n !== talk.answerN) { talk.answerN = answer.n; talk.spokenUpTo = 0; }
    if (answer.cancelled) { if (talk.speaking) stopSpeaking(); return; }
    const text = answer.text || "";
    let end = talk.spokenUpTo;
    if (answer.done) end = text.length;
    else {
      const tail = text.slice(talk.spokenUpTo);
      const m = [...tail.matchAll(/[.!?。！？](\s|$)|\n/g)].pop();
      if (m) end = talk.spokenUpTo + m.index + m[0].length;
    }
    if (end > talk.spokenUpTo) { speak(text.slice(talk.spokenUpTo, end)); talk.spokenUpTo = end; }
  }

  // Talk's state comes pushed, a JSON line each time it changes, over one
  // request for as long as Talk is on (/webrtc/talk/stream); polling it took
  // seven requests a second and filled the server's access log.
  function onTalkState(t) {
    if (t.speech_starts > talk.speechStarts && talk.speaking) stopSpeaking();  // barge-in
    talk.speechStarts = t.speech_starts;
    readAloud(t.answer);
    const a = t.answer;
    const status = t.hearing ? "hearing" : talk.speaking ? "speaking"
      : a && !a.done ? (a.text ? "answering" : "thinking") : t.listening ? "listening" : "off";
    showTalkStatus(status);
  }

  async function followTalk() {
    const run = ++talk.run;  // a newer Talk-on starts its own loop: this one ends
    const mine = () => talk.on && talk.run === run;
    while (mine()) {
      if (!state.sessionId) {
        showTalkStatus("off");
        await new Promise((r) => { talk.timer = setTimeout(r, 500); });
        continue;
      }
      const sid = state.sessionId;
      const stop = talk.stream = new AbortController();
      try {
        const r = await fetch(`/webrtc/talk/stream?session_id=${encodeURIComponent(sid)}`,
                              { headers: authHeaders(), cache: "no-store", signal: stop.signal });
        if (r.ok && r.body) {
          const reader = r.body.getReader();
          const decoder = new TextDecoder();
          let buffered = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done || !mine() || state.sessionId !== sid) break;
            buffered += decoder.decode(value, { stream: true });
            let nl;
            while ((nl = buffered.indexOf("\n")) >= 0) {
              const line = buffered.slice(0, nl);
              buffered = buffered.slice(nl + 1);
              if (line.trim()) onTalkState(JSON.parse(line));
            }
          }
          stop.abort();
        }
      } catch (_) { /* stopped, or the server restarting: follow again below */ }
      if (mine()) await new Promise((r) => { talk.timer = setTimeout(r, 1000); });
    }
  }

  function setTalk(on) {
    if (on === talk.on) return;
    talk.on = on;
    clearTimeout(talk.timer);
    talk.stream?.abort();
    if (on) { talk.firstN = null; followTalk(); }
    else { stopSpeaking(); showTalkStatus("off"); }
  }

  function listVoices() {
    const select = $("#vc-voice");
    if (!select || !window.speechSynthesis) return;
    const voices = speechSynthesis.getVoices();
    const chosen = select.value;
    select.innerHTML = '<option value="">browser default</option>' + voices.map((v) =>
      `<option value="${v.name.replace(/"/g, "&quot;")}">${v.name.replace(/</g, "&lt;")} (${v.lang})</option>`).join("");
    select.value = chosen;
  }
  if (window.speechSynthesis) speechSynthesis.addEventListener?.("voiceschanged", listVoices);

  document.addEventListener("change", (e) => {
    if (e.target.closest?.("#vc-talk")) setTalk(!!e.target.checked);
  });
  document.addEventListener("click", (e) => {
    if (e.target.closest?.("#vc-mute")) {
      talk.muted = !talk.muted;
      const btn = $("#vc-mute");
      btn.textContent = talk.muted ? "🔇 Muted" : "🔊 Read aloud";
      btn.setAttribute("aria-pressed", String(talk.muted));
      if (talk.muted) stopSpeaking();
    } else if (e.target.closest?.("#vc-stop-answer")) stopSpeaking();
    else if (e.target.closest?.("#vc-voice")) listVoices();
  });

  // Closing the tab ends the server's peer at once instead of after ICE times out.
  window.addEventListener("pagehide", () => {
    if (state.sessionId) navigator.sendBeacon(beaconUrl("/webrtc/close"), JSON.stringify({ session_id: state.sessionId }));
  });

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
    // Diagnostics: typed questions asked and whose chat event has ended
    // (counted by the page's own events, vidchat/doors/page/layout.py): equal counts mean
    // no typed question is still being answered.
    questions: { asked: 0, finished: 0 },
    // Diagnostics: Clear chat events ended (vidchat/doors/page/events.py),
    // each once its empty chat is shown.
    clears: 0,
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
})();
