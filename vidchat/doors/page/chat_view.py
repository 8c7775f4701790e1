"""The chat panel drawn from the conversation's history, which keeps the
chat on the server: what a tab's chat feed starts from (vidchat.doors.page.chat_feed;
a reload shows the same chat), so the chat it shows is the one the model has. Each exchange is its question,
its answer's text (marked where it was cut short) and, while the session
still keeps that answer's inputs, the "what the model got" fold under it."""

from __future__ import annotations

from typing import Any

from vidchat.doors.page.view import STOPPED, fold_message, notice


def chat_messages(state: Any, entry: Any) -> list[dict[str, Any]]:
    """The chat's messages, oldest first, as the page's chatbot shows them."""
    messages: list[dict[str, Any]] = []
    for exchange in entry.history.exchanges:
        messages.append({"role": "user", "content": exchange.question})
        messages.append({"role": "assistant", "content": exchange.answer})
        if exchange.stopped:
            messages.append(notice(STOPPED))
        answer = entry.answers.get(exchange.answer_id) if exchange.answer_id else None
        if answer is not None:
            messages.append(fold_message(entry, answer, exchange.answer_id))
    return messages
