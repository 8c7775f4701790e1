"""The Gradio page (placeholder until the live-page work lands)."""
from __future__ import annotations

import gradio as gr


def mount(app, state):
    with gr.Blocks(title="vidchat") as blocks:
        if state.banner:
            gr.Markdown(f"**{state.banner}**")
        gr.Markdown("# vidchat")
    return gr.mount_gradio_app(app, blocks, path="/")
