"""The model's own processor and chat template as the engines call them:
the keyword arguments transformers wants, and what one webcam frame costs
in prompt tokens."""

from __future__ import annotations

from typing import Any

from PIL import Image

# The frame the page sends from a webcam before any pixel cap.
TYPICAL_FRAME = (640, 480)


def chat_template_kwargs(processor_kwargs: dict | None) -> dict[str, Any]:
    """The processor's kwargs as transformers 5 wants them at apply_chat_template:
    in ``processor_kwargs``. SmolVLM's processor otherwise puts its video
    defaults (num_frames, fps) in ``**kwargs``, and transformers then warns
    "Kwargs passed to processor.__call__ have to be in processor_kwargs
    dict" at every prompt built: once per question and warm-up. A copy each
    time: SmolVLM's processor adds those defaults to the dict it is given."""
    return {"processor_kwargs": dict(processor_kwargs)} if processor_kwargs else {}


def tokens_per_frame(processor: Any, max_image_pixels: int = 0, processor_kwargs: dict | None = None) -> int:
    """Prompt tokens one webcam frame costs with this processor: a 640x480
    frame as sent, and as sessions store it (scaled down to
    ``max_image_pixels``), run through the model's own processor, minus the
    same prompt without it; the larger of the two (the processor's rounding
    to its patch grid can make the smaller frame cost more)."""
    sizes = [TYPICAL_FRAME]
    width, height = TYPICAL_FRAME
    if max_image_pixels and width * height > max_image_pixels:
        scale = (max_image_pixels / (width * height)) ** 0.5
        sizes.append((max(1, int(width * scale)), max(1, int(height * scale))))
    question = {"type": "text", "text": "?"}
    with_frame = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, question]}],
                                               tokenize=False, add_generation_prompt=True,
                                               **chat_template_kwargs(processor_kwargs))
    without = processor.apply_chat_template([{"role": "user", "content": [question]}],
                                            tokenize=False, add_generation_prompt=True,
                                            **chat_template_kwargs(processor_kwargs))
    base = len(processor.tokenizer(without)["input_ids"])
    costs = []
    for size in sizes:
        ids = processor(text=[with_frame], images=[Image.new("RGB", size, (90, 90, 90))],
                        return_tensors="np", **(processor_kwargs or {}))["input_ids"]
        costs.append(int(len(ids[0]) - base))
    return max(costs)
