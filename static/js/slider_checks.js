// A value typed into a setting slider's box that is out of its range (or not
// a number) is refused here, in the settings table's words: Gradio's own
// slider clamps it on blur without a word (0 frames became 1, 'abc' became
// 0), so the question would go with a value the user never chose. The field
// is marked and named, and no question is sent until it is fixed.
import { $ } from "./state.js";

const refused = new Map();  // slider block id -> why

function sliderBlock(input) {
  const block = input.closest?.("[id]");
  return block && block.querySelector("input[type=range]") ? block : null;
}

// The field's name alone: Gradio's label element holds the help text too.
function labelOf(block) {
  const label = block.querySelector("[data-testid='block-info']") || block.querySelector("label");
  return (label?.textContent || block.id).trim();
}

// The settings table's rule, read from the slider itself: its range and step.
function problem(block, input) {
  const range = block.querySelector("input[type=range]");
  const low = Number(range.min), high = Number(range.max), step = Number(range.step);
  const whole = Number.isInteger(step) && step >= 1;
  const raw = input.value;
  const n = Number(raw);
  const got = input.validity?.badInput ? "something that is not a number" : raw === "" ? "nothing" : raw;
  const fine = raw !== "" && !input.validity?.badInput && Number.isFinite(n) && n >= low && n <= high &&
    (!whole || Number.isInteger(n));
  return fine ? null : `${labelOf(block)} must be ${whole ? "a whole number" : "a number"} in ${low}..${high}, got ${got}`;
}

function show() {
  const box = $("#vc-refused");
  if (!box) return;
  const why = [...refused.values()];
  box.hidden = !why.length;
  box.textContent = why.length ? `⚠ ${why.join("; ")}. Nothing was asked: fix the setting, then ask again.` : "";
}

// Read as it is typed, before Gradio's slider sees it (capture). Moving the
// slider itself picks a value in range: whatever was refused is fixed.
document.addEventListener("input", (e) => {
  const input = e.target;
  if (input?.matches?.("input[type=range]") && sliderBlock(input)) {
    const block = sliderBlock(input);
    block.classList.remove("vc-invalid");
    refused.delete(block.id);
    show();
    return;
  }
  if (!input?.matches?.("input[type=number]")) return;
  const block = sliderBlock(input);
  if (!block) return;
  const why = problem(block, input);
  block.classList.toggle("vc-invalid", Boolean(why));
  if (why) refused.set(block.id, why); else refused.delete(block.id);
  show();
}, true);

// A refused value stays in its box as typed: Gradio's slider would clamp it
// when the box loses focus (0 frames became 1), and the box would then show
// a value the refusal does not name. Its handlers don't hear of a refused box.
for (const type of ["blur", "focusout", "change"]) {
  document.addEventListener(type, (e) => {
    const input = e.target;
    if (!input?.matches?.("input[type=number]")) return;
    const block = sliderBlock(input);
    if (block && refused.has(block.id)) e.stopImmediatePropagation();
  }, true);
}

// Whether a question may go: false (and the refusal shown) while a setting is refused.
export function settingsAccepted() {
  show();
  return refused.size === 0;
}
