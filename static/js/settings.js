// The settings a typed question is asked with, read from the page's own
// controls as Gradio shows them (by their elem_id, vidchat/doors/page/layout.py),
// under the settings table's names (vidchat/doors/page/questions.py
// PAGE_SETTINGS). A control not on the page is left out: the server asks
// with the page's default for it.

function box(id, selector) {
  return document.querySelector(`#${id} ${selector}`);
}

function number(id) {
  const input = box(id, "input[type=number]");
  if (!input) return undefined;
  return input.value === "" ? null : Number.isFinite(Number(input.value)) ? Number(input.value) : input.value;
}

function checked(id) {
  const input = box(id, "input[type=checkbox]");
  return input ? input.checked : undefined;
}

function text(id) {
  const input = box(id, "textarea") || box(id, "input");
  return input ? input.value : undefined;
}

function chosen(id) {
  const input = box(id, "input[type=radio]:checked");
  return input ? input.value : undefined;
}

export function readSettings() {
  const read = {
    num_sample_frames: number("vc-frames-per-question"),
    sampling: text("vc-sampling"),  // its label: the server takes the strategy it names
    sample_seconds: number("vc-sample-seconds"),
    evs_enabled: checked("vc-evs"),
    evs_threshold: number("vc-evs-threshold"),
    max_frames: number("vc-max-frames"),
    frames_as: chosen("vc-frames-as"),
    include_audio: checked("vc-include-audio"),
    max_tokens: number("vc-max-tokens"),
    temperature: number("vc-temperature"),
    seed: text("vc-seed"),
    record: checked("vc-record"),
    system_prompt: text("vc-system-prompt"),
    scene_change_share: number("vc-scene-share"),
  };
  return Object.fromEntries(Object.entries(read).filter(([, value]) => value !== undefined));
}
