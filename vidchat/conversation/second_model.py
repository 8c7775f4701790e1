"""Both models, live (``--compare-model``): with the session's switch on,
each question of the chat is asked of the second model too, on the very
frames, audio, chat and seed the first model got, so the two answers differ
only by the model. It runs in a slot of its own beside the chat (a re-ask
never replaces it, nor it the chat's answer), waits for its place in the same
fair queue as every answer, and is kept and recorded as an answer of its own
(its own "what the model got" and bundle). Its events are the session's,
marked ``second`` with the chat question's ticket, so every door can show
the two side by side; it never joins the chat's history (the chat continues
with the first model's answers)."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from vidchat.conversation.answer_path import Answer, NoFrames, Superseded, ask as ask_answer
from vidchat.conversation.runs import AnswerRun
from vidchat.conversation.session_events import Notice
from vidchat.engine import EngineError, Turn

log = logging.getLogger(__name__)

NOT_ANSWERED = "Both models: the second model did not answer this question. "


async def ask_second(conversation: Any, first: Answer, history: Sequence[Turn], *,
                     record: bool) -> AnswerRun | None:
    """The second model's answer to the chat's question ``first`` (None,
    with a notice in the chat, when it can't answer)."""
    state = conversation.state
    slot = conversation.second_slot()
    await slot.cancel_answer()  # the previous question's second answer, if it still runs
    ready, reason = state.compare_readiness()
    if not ready:
        conversation.event_hub.publish(Notice(NOT_ANSWERED + reason))
        return None
    ticket = first.ticket
    try:
        answer = await ask_answer(state.compare_engine, slot, first.question, first.options, history=history,
                                  queue=state.answer_gate, sample=first.sample, spoken=first.spoken, ticket=ticket,
                                  current=lambda: conversation.turn == ticket and not conversation.closed)
    except Superseded:
        return None
    except (EngineError, NoFrames, ValueError) as exc:
        conversation.event_hub.publish(Notice(NOT_ANSWERED + str(exc)))
        return None
    answer.chat = conversation.generation
    return AnswerRun(conversation, slot, answer, record=record, continues_chat=False, remember=True)
