// Talk mode: the server listens (vidchat/conversation/modes.py); this tab shows
// what it hears and reads the answers aloud with the browser's own speech
// synthesis (no server cost), stopping at once on barge-in or Stop.
import { authHeaders } from "./api.js";
import { $, state } from "./state.js";

export const talk = {
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

function showTalkStatus(status, detail) {
  talk.status = status;
  const el = $("#vc-talk-status");
  if (el) {
    el.textContent = (STATUS_TEXT[status] || status) + (detail ? `: ${detail}` : "");
    el.dataset.state = status;
  }
}

// The microphone's level as the server hears it (dBFS, -60 to 0 fills the
// meter), and what a steady "listening" means: sound but no speech yet, or
// no audio reaching the server at all.
const QUIET_DBFS = -50, NO_AUDIO_S = 2;
function showLevel(t) {
  const meter = $("#vc-talk-level");
  if (meter) {
    const db = t.level_dbfs;
    meter.hidden = !t.listening;
    meter.dataset.dbfs = db == null ? "" : String(db);
    meter.style.setProperty("--level", db == null ? "0" : Math.max(0, Math.min(1, (db + 60) / 60)).toFixed(3));
    meter.title = db == null ? "no audio yet" : `microphone ${Math.round(db)} dBFS`;
  }
  if (!t.listening || t.hearing) return "";
  if (t.audio_age_s == null || t.audio_age_s > NO_AUDIO_S) return "no audio reaching the server";
  return t.level_dbfs != null && t.level_dbfs > QUIET_DBFS ? "hearing sound, no speech yet" : "";
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
  const heard = showLevel(t);
  showTalkStatus(status, status === "listening" ? heard : "");
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
  else { stopSpeaking(); showTalkStatus("off"); showLevel({ listening: false }); }
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
