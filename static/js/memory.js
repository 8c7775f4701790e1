// The session's memory under the preview (vidchat/conversation/memory.py):
// a strip of its scene log's keyframes, each with its time and caption (a
// caption shows up once the model has written it), the switch that turns
// memory on or off for this session, and a pick that pins a keyframe to the
// next question. Read from GET /sessions/<id>/memory at each stats tick;
// drawn again only when the log, the pin or the switch changed.
import { authHeaders } from "./api.js";
import { $, esc, state } from "./state.js";

let drawn = "";

function clock(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  const mm = h ? String(m).padStart(2, "0") : String(m);
  return `${h ? `${h}:` : ""}${mm}:${String(r).padStart(2, "0")}`;
}

function url(suffix = "") {
  return `/sessions/${encodeURIComponent(state.sessionId)}/memory${suffix}`;
}

async function post(suffix, body) {
  const r = await fetch(url(suffix), { method: "POST", body: JSON.stringify(body),
                                      headers: authHeaders({ "Content-Type": "application/json" }) });
  return r.ok ? r.json() : null;
}

function note(m) {
  if (!m.memory) return "Off: tick it to keep a keyframe of each scene, captioned while the model is idle, "
    + "so later questions can ask about earlier moments.";
  if (!m.keyframes.length) return "On: a keyframe is kept at each scene change.";
  const n = m.keyframes.length;
  const captioned = m.keyframes.filter((k) => k.caption != null).length;
  return `${n} scene${n === 1 ? "" : "s"}, ${captioned} captioned${m.thinned ? `, older ones thinned (${m.thinned})` : ""}`
    + (m.pinned != null ? " · the picked keyframe goes with the next question" : " · pick one to show it to the next question");
}

function draw(m) {
  const box = $("#vc-memory");
  box.hidden = false;
  $("#vc-memory-on").checked = m.memory;
  $("#vc-memory-note").textContent = note(m);
  const strip = $("#vc-memory-strip");
  const atEnd = strip.scrollLeft + strip.clientWidth >= strip.scrollWidth - 8;
  strip.innerHTML = m.keyframes.map((k) => {
    const caption = k.caption == null ? "…" : k.caption || "(no caption)";
    return `<button type="button" class="vc-keyframe" role="listitem" data-seq="${k.seq}"`
      + ` aria-pressed="${k.seq === m.pinned}" title="${esc(`${clock(k.time_s)} from the start: ${caption}`)}">`
      + `<img src="${esc(k.thumbnail)}" alt="keyframe at ${clock(k.time_s)}" loading="lazy">`
      + `<span class="vc-kf-time">${clock(k.time_s)}</span>`
      + `<span class="vc-kf-caption${k.caption == null ? " vc-kf-pending" : ""}">${esc(caption)}</span></button>`;
  }).join("");
  if (atEnd) strip.scrollLeft = strip.scrollWidth;  // follow the newest, unless the user scrolled back
}

let remembering = false;

// tick: the stats loop's count. With memory off the strip only has its switch
// to show: it is asked every third tick then, every tick while captions come.
export async function refreshMemory(tick = 0) {
  if (!$("#vc-memory") || !state.sessionId) return;
  if (!remembering && tick % 3) return;
  try {
    const r = await fetch(url(), { cache: "no-store", headers: authHeaders() });
    if (!r.ok) return;
    const m = await r.json();
    remembering = m.memory;
    const key = `${m.session_id}/${m.version}/${m.pinned}/${m.memory}`;
    if (key !== drawn) {
      drawn = key;
      draw(m);
    }
  } catch (_) { /* next tick */ }
}

document.addEventListener("click", async (e) => {
  const pick = e.target.closest("#vc-memory-strip .vc-keyframe");
  if (!pick || !state.sessionId) return;
  const seq = Number(pick.dataset.seq);
  const pinned = pick.getAttribute("aria-pressed") === "true";
  await post("/pin", { seq: pinned ? null : seq });
  await refreshMemory();
});

document.addEventListener("change", async (e) => {
  if (e.target.id !== "vc-memory-on" || !state.sessionId) return;
  await post("", { memory: e.target.checked });
  remembering = e.target.checked;
  await refreshMemory();
});
