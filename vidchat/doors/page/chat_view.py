"""The chat panel drawn from the conversation, which keeps the chat on the
server: what a tab shows when it comes back to its session (a reload), so
the chat it shows is the one the model has. Each exchange is its question,
its answer's text (marked where it was cut short) and, while the session
still keeps that answer's inputs, the "what the model got" fold under it."""

from __future__ import annotations

import asyncio
from typing import Any

import gradio as gr

from vidchat import conversation
from vidchat.conversation import kept
from vidchat.doors.page.view import STOPPED, fold_message, frames_html, notice


def chat_messages(state: Any, entry: Any) -> list[dict[str, Any]]:
    """The chat's messages, oldest first, as the page's chatbot shows them."""
    messages: list[dict[str, Any]] = []
    for exchange in conversation.of(state, entry).history.exchanges:
        messages.append({"role": "user", "content": exchange.question})
        messages.append({"role": "assistant", "content": exchange.answer})
        if exchange.stopped:
            messages.append(notice(STOPPED))
        answer = entry.answers.get(exchange.answer_id) if exchange.answer_id else None
        if answer is not None:
            messages.append(fold_message(entry, answer, exchange.answer_id))
    return messages


async def restored_chat(state: Any, sid: str | None) -> tuple:
    """The chat panel, "what the model got" and the last reply's details of a
    session the tab came back to; nothing changes for a session whose chat is
    empty (a new one: the tab's own chat stays as it is)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is None or not len(conversation.of(state, entry).history):
        return gr.skip(), gr.skip(), gr.skip()
    messages = await asyncio.to_thread(chat_messages, state, entry)
    last_id, last = next(((answer_id, answer) for answer_id, answer in kept.chat_answers(entry)
                          if answer.reply.text), (None, None))
    if last is None:
        return messages, gr.skip(), gr.skip()
    return messages, await asyncio.to_thread(frames_html, last, last_id, last_id in entry.bundles), last.summary()
