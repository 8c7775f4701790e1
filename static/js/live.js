// What the session is doing, live: the status line's figures every second,
// and the newest kept frames with a chart of answer timings every third.
import { authHeaders } from "./api.js";
import { refreshMemory } from "./memory.js";
import { reportSource, streamName } from "./source.js";
import { $, setNote, setStatus, state } from "./state.js";

const RATE_WINDOW_MS = 3000; // the status line's fps and % kept: over about the last 3 s

// Stats every second, the live view every third time. The next poll is
// set once this one has its answer: on a loaded machine, where an answer
// can take longer than the interval, polls would otherwise pile up and
// take the browser's few connections to the server from the questions.
// sessionGone: run when the server has ended the session (after saying why).
export function startStatsPolling(sessionGone) {
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
          await sessionGone();
          return;
        }
        if (r.ok) renderStats(await r.json());
        await refreshMemory(state.ticks);
        // A stream's preview is its newest kept frame: refreshed each tick, the live strip every third.
        if (++state.ticks % 3 === 0 || streamName(state.source)) await refreshLiveView();
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
    showStreamFrame(live.kept[live.kept.length - 1]);
    view.hidden = false;
    $("#vc-kept").innerHTML = live.kept.map((f) =>
      `<figure><img src="${f.src}" alt="kept frame ${f.index}"><figcaption>#${f.index} · ${f.t.toFixed(1)} s</figcaption></figure>`).join("");
    drawChart(live.answers);
  } catch (_) { /* next tick */ }
}

// A stream of the server's (--stream) has no picture in this tab: the
// preview shows the frames the server keeps of it instead, as they come.
function showStreamFrame(newest) {
  const img = $("#vc-stream-frame");
  if (!img) return;
  const on = Boolean(streamName(state.source) && newest);
  img.hidden = !on;
  if (on && img.getAttribute("src") !== newest.src) img.src = newest.src;
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

export function stopStatsPolling() {
  clearTimeout(state.statsTimer);
  state.statsTimer = null;
  state.statsLoop = null;
}

// The stored-size note from the live figures, not a 640×480 example: what
// arrives and what it is stored as, and why what arrives can be less than
// the resolution asked for.
function showStoreNote(s) {
  const note = $("#vc-store");
  if (!note || !s.frame_size || !s.received_size) return;
  if (!note.dataset.rule) note.dataset.rule = note.textContent.split(" (")[0].replace(/\.$/, "");  // the rule, once
  const [rw, rh] = s.received_size.split("x").map(Number);
  const [aw, ah] = ($("#vc-res")?.value || "").split("x").map(Number);
  const lowered = state.source === "camera" && aw && rw * rh < aw * ah
    ? ` The camera was asked for ${aw}×${ah}: the browser sends less while the machine or the network is busy.` : "";
  note.textContent = `${note.dataset.rule}: this source's ${rw}×${rh} frames are stored as ` +
    `${s.frame_size.replace("x", "×")}.${lowered}`;
}

// A stream of the server's (--stream): its state (and why, while it
// reconnects), then its own rate, size and latency from its frame time to the buffer.
function streamFigures(st) {
  if (st.state !== "live") return `${st.name}: ${st.state}${st.error ? ` (${st.error})` : ""}`;
  const latency = st.latency_ms != null ? `, latency ${Math.round(st.latency_ms)} ms` : "";
  return `${st.name}: live, ${st.fps} fps, ${st.width}×${st.height}${latency}`;
}

// What Watch is doing, from the server's figures (/webrtc/stats "watch"):
// for how long, the scene changes seen, the questions asked, what it waits for.
function renderWatch(w) {
  const el = $("#vc-watch-status");
  if (!el) return;
  el.hidden = !w;
  if (!w) { el.textContent = ""; return; }
  const head = `Watching for ${Math.round(w.for_s)} s`;
  if (w.waiting === "scene_change") {
    const share = `${Math.round(w.scene_change_share * 100)} %`;
    el.textContent = `${head}: no scene change yet (one is ${share} of the picture changed, or crossed by ` +
      "motion; a lower Scene change share in Settings is more sensitive).";
    return;
  }
  const seen = `${w.scene_changes} scene change${w.scene_changes === 1 ? "" : "s"}`;
  const asked = w.asked ? `, asked ${w.asked} (the last ${w.last_asked_s_ago} s ago)` : ", nothing asked yet";
  const pause = w.waiting === "pause"
    ? `; the newest change is asked in ${w.asks_in_s} s (at most every ${w.every_s} s)` : "";
  el.textContent = `${head}: ${seen}${asked}${pause}.`;
}

// s: the server's figures, or none (idle says why: "No session", or a
// stopped tab's session that waits for Start).
// The badge over the preview says the stream's own state (its reader's, on
// the server), with the reason, never "Live" over a stream that is not.
function streamBadge(st) {
  if (!st || !streamName(state.source) || !state.wantRunning) return;
  if (st.state === "live") setStatus("Live", "live");
  else setStatus(`${st.state === "reconnecting" ? "Reconnecting" : "Down"}${st.error ? `: ${st.error}` : ""}`,
                 st.state === "reconnecting" ? "busy" : "error");
}

export function renderStats(s, idle = "No session") {
  renderWatch(s?.watch);
  streamBadge(s?.stream);
  if (!s) showStreamFrame(null);
  const el = $("#vc-stats");
  if (!el) return;
  if (!s) {
    el.textContent = idle;
    state.rateWindow = null;
    const view = $("#vc-live-view");
    if (view) view.hidden = true;
    return;
  }
  const m = s.media || {};
  const now = performance.now();
  const watched = s.stream ? [streamFigures(s.stream)] : [];
  const rates = [];
  // Rates over the last few seconds of samples, never over a moment: two
  // reports close together (a source switch, a restart) once showed
  // "11029.4 fps in". A counter that went back (a new session or track)
  // starts the window again; until it spans a second, no rate is shown.
  // A stream's frames reach the session from the server's reader, not over the peer.
  const seenNow = s.stream ? s.frames_received : (m.video_frames_seen ?? s.frames_received);
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
  const parts = [...watched, ...rates,
    `${seenNow} frames received`,
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
  showStoreNote(s);
  el.dataset.ending = s.time_left_s != null && s.time_left_s < 60 ? "soon" : "";
}
