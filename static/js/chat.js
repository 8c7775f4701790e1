// The chat panel and "What the model got", drawn only from the session's
// event stream (GET /webrtc/events?view=chat): the server says the chat as
// drawing instructions (vidchat/doors/page/chat.py chat_draws: the messages
// in order by key, the HTML of those new or changed, Markdown rendered on the
// server with raw HTML off). A reload, a second tab, Watch, Talk and typed
// questions all reach the chat this way; this module keeps no chat of its own.
import { authHeaders } from "./api.js";
import { $, state } from "./state.js";

// Typed questions asked and whose outcome the chat shows (window.vidchat.questions):
// equal counts mean no typed question is still being answered.
export const questions = { asked: 0, finished: 0 };
// Clear chat presses whose empty chat is shown (window.vidchat.clears).
export const counts = { clears: 0 };

const chat = {
  sessionId: "",
  reading: null,       // the AbortController of the stream being read
  generation: null,    // the chat drawn (Clear starts another)
  pending: new Set(),  // tickets of this tab's questions not yet shown ended
  ended: new Set(),    // tickets the chat showed ended (a draw may come before the question's reply)
  clearing: 0,         // Clear presses waiting for their empty chat
};

const list = () => $("#vc-chat .vc-chat-list");

// The list follows new text while the reader has not scrolled up from its
// end (a streaming answer scrolls into view); a reader who scrolled up is
// left where they are until they scroll back down. Judged by the reader's
// scrolling, not by where the end is now: opening a fold makes the list
// taller without anyone scrolling, and the next answer is still followed.
function atEnd(el) {
  return el.scrollHeight - el.scrollTop - el.clientHeight < 24;
}
let following = true;
document.addEventListener("scroll", (e) => {
  const el = list();
  if (el && e.target === el) following = atEnd(el);
}, true);

function element(key, html) {
  const holder = document.createElement("div");
  holder.innerHTML = html;
  const node = holder.firstElementChild || document.createElement("div");
  node.dataset.key = key;
  for (const pre of node.querySelectorAll(".vc-md pre")) {
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "vc-copy vc-copy-code";
    copy.title = "Copy";
    copy.setAttribute("aria-label", "Copy this code");
    copy.innerHTML = $("#vc-copy-icon")?.innerHTML ?? "Copy";
    pre.classList.add("vc-code");
    pre.append(copy);
  }
  return node;
}

function draw(body) {
  const el = list();
  if (!el) return;
  const follow = following || atEnd(el);
  if (body.reset) {
    el.replaceChildren();
    if (chat.generation !== null && body.generation !== chat.generation && chat.clearing > 0) {
      chat.clearing -= 1;
      counts.clears += 1;
    }
  }
  chat.generation = body.generation;
  const have = new Map([...el.children].map((node) => [node.dataset.key, node]));
  const wanted = new Set(body.order);
  for (const [key, node] of have) if (!wanted.has(key)) node.remove();
  let before = el.firstElementChild;
  for (const key of body.order) {
    let node = have.get(key);
    const html = body.html[key];
    if (html !== undefined) {
      const fresh = element(key, html);
      // A fold the reader opened stays open when its message is drawn again.
      if (node?.querySelector("details[open]")) fresh.querySelector("details")?.setAttribute("open", "");
      if (node) {
        if (node === before) before = node.nextElementSibling;
        node.remove();
      }
      node = fresh;
    }
    if (!node) continue;
    if (node === before) before = node.nextElementSibling;
    else el.insertBefore(node, before);
  }
  for (const ticket of body.ended) {
    chat.ended.add(ticket);
    if (chat.pending.delete(ticket)) questions.finished += 1;
  }
  if (chat.ended.size > 256) chat.ended.delete(chat.ended.values().next().value);
  if (follow || body.reset) el.scrollTop = el.scrollHeight;
}

// What the model got, newest. Gradio draws a folded panel's contents only
// once it is first opened: kept here and drawn whenever its box appears.
let inputs = null;
let inputsDrawn = 0;

function fillInputs() {
  const html = $("#vc-inputs-html");
  if (!inputs || !html || html.dataset.drawn === String(inputsDrawn)) return;
  html.innerHTML = inputs.html;
  html.dataset.drawn = String(inputsDrawn);
  const details = $("#vc-details");
  if (details) details.textContent = JSON.stringify(inputs.details, null, 2);
}

function drawInputs(body) {
  inputs = body;
  inputsDrawn += 1;
  fillInputs();
}

new MutationObserver(fillInputs).observe(document.documentElement, { childList: true, subtree: true });

// One server-sent event: "event: name" and "data: {json}" lines.
function dispatch(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) name = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (!data.length) return name;
  const body = JSON.parse(data.join("\n"));
  if (name === "chat.draw") draw(body);
  else if (name === "inputs.view") drawInputs(body);
  else if (name === "closed") sessionEnded(body.reason || "");
  return name;
}

// The session ended (the time limit, idle, the server's shutdown): its chat
// stays on screen, and says that it ended and why; Start begins a new one.
function sessionEnded(reason) {
  const el = list();
  if (!el || el.querySelector(".vc-ended")) return;
  const note = document.createElement("div");
  note.className = "vc-msg vc-notice vc-ended";
  note.dataset.testid = "session-ended";
  note.textContent = `This session has ended${reason ? ` (${reason})` : ""}. Its chat stays here to read; `
    + "the next Start begins a new session with an empty chat.";
  el.append(note);
  el.scrollTop = el.scrollHeight;
}

// Read the session's chat for as long as it runs. fetch, not EventSource:
// the request carries the page's credential in its header, as every other.
async function read(sid, signal) {
  for (let attempt = 0; chat.sessionId === sid && !signal.aborted; attempt++) {
    let closed = false;
    try {
      const r = await fetch(`/webrtc/events?view=chat&session_id=${encodeURIComponent(sid)}`,
                            { headers: authHeaders(), signal, cache: "no-store" });
      if (r.status === 403 || r.status === 404) return;  // another's, or gone: nothing to draw
      if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      attempt = 0;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (dispatch(block) === "closed") closed = true;
          // Draws that arrived together are still shown one after another
          // (the question with "Thinking…", then its first words), each
          // rendered before the next replaces it.
          if (buffer.includes("\n\n")) await new Promise((resolve) => setTimeout(resolve, 0));
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    if (closed) return;  // the session ended: its chat stays as drawn
    // The stream broke (a proxy, the network): read it again, drawn afresh.
    await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 500 * 2 ** attempt)));
  }
}

// A new session (Start camera, a resumed tab) brings its chat; none (Stop)
// leaves the chat as it was drawn.
document.addEventListener("vidchat:session", (e) => {
  const sid = e.detail || "";
  if (sid === chat.sessionId) return;
  chat.reading?.abort();
  chat.reading = null;
  chat.sessionId = sid;
  if (!sid) return;
  chat.generation = null;
  chat.pending.clear();
  chat.ended.clear();
  const reading = new AbortController();
  chat.reading = reading;
  read(sid, reading.signal);
});

// This tab's question was asked (its ticket) or not (null): finished once the chat shows its outcome.
export function questionSent(ticket) {
  if (ticket === null || ticket === undefined || chat.ended.has(ticket)) questions.finished += 1;
  else chat.pending.add(ticket);
}

// A question asked with no session: the chat says so here, as the server would.
export function saidWithoutSession(text) {
  const el = list();
  if (!el) return;
  const user = document.createElement("div");
  user.className = "vc-msg vc-user";
  user.dataset.testid = "user";
  user.dataset.key = `local${el.children.length}`;
  const body = document.createElement("div");
  body.className = "vc-md";
  body.textContent = text;
  user.append(body);
  const note = $("#vc-not-running")?.content.firstElementChild?.cloneNode(true);
  el.append(user, ...(note ? [note] : []));
  el.scrollTop = el.scrollHeight;
}

document.addEventListener("click", (e) => {
  const copy = e.target.closest?.("#vc-chat .vc-copy");
  if (copy) {
    const source = copy.classList.contains("vc-copy-code") ? copy.closest("pre")?.querySelector("code")
      : copy.closest(".vc-msg")?.querySelector(".vc-md");
    navigator.clipboard?.writeText(source?.innerText ?? "").then(() => {
      copy.dataset.copied = "true";  // said by its colour for a moment
      setTimeout(() => { delete copy.dataset.copied; }, 1200);
    }).catch(() => {});
    return;
  }
  if (e.target.closest?.("#vc-chat .vc-chat-clear")) $("#vc-clear")?.click();
  else if (e.target.closest?.("#vc-clear")) {
    // Counted once the empty chat shows (a draw of the next chat); with no
    // session there is no conversation to clear: the panel empties here.
    if (chat.sessionId && state.sessionId) chat.clearing += 1;
    else { list()?.replaceChildren(); counts.clears += 1; }
  }
});
