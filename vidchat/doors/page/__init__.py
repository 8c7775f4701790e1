"""The Gradio page: live preview and chat side by side, settings folded away,
and a panel showing exactly what the model was given for the last question.

Browser behaviour (camera, WebRTC) lives in static/vidchat.js and its modules in static/js/. Here:
:mod:`~vidchat.doors.page.chat` (how the chat shows things), :mod:`~vidchat.doors.page.questions`
(the page's questions through the conversation, the same answer path the
WebSocket door uses), :mod:`~vidchat.doors.page.chat` (the chat, drawn from the session's events),
:mod:`~vidchat.doors.page.questions` (re-ask and compare), :mod:`~vidchat.doors.page.questions` (Watch and Talk),
:mod:`~vidchat.doors.page.layout` (the controls) and :mod:`~vidchat.doors.page.layout`
(which function each runs).
"""

from vidchat.doors.page.chat import NOT_RUNNING, STOPPED, compare_html, notice
from vidchat.doors.page.layout import access_mode, hf_page_token, mount, password_page_token
from vidchat.doors.page.questions import (
           clear_chat,
           page_request,
           reask,
           respond,
           stop_answer,
           talk_switch,
           watch_switch,
)

__all__ = ["NOT_RUNNING", "STOPPED", "access_mode", "clear_chat", "compare_html", "hf_page_token",
           "mount", "notice", "page_request", "password_page_token", "reask", "respond",
           "stop_answer", "talk_switch", "watch_switch"]
