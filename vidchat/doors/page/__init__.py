"""The Gradio page: live preview and chat side by side, settings folded away,
and a panel showing exactly what the model was given for the last question.

Browser behaviour (camera, WebRTC, the question as one request, the chat
panel drawn from the session's events) lives in static/vidchat.js and its
modules in static/js/. Here: :mod:`~vidchat.doors.page.chat` (the chat said
from the session's events, Markdown rendered on the server),
:mod:`~vidchat.doors.page.questions` (a typed question through the
conversation, re-ask and compare, Watch and Talk) and
:mod:`~vidchat.doors.page.layout` (the controls, and which function each runs).
"""

from vidchat.doors.page.chat import NOT_RUNNING, REPLACED_MID, REPLACED_NOTE, STOPPED, compare_html, notice
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

__all__ = ["NOT_RUNNING", "REPLACED_MID", "REPLACED_NOTE", "STOPPED", "access_mode", "clear_chat", "compare_html", "hf_page_token",
           "mount", "notice", "page_request", "password_page_token", "reask", "respond",
           "stop_answer", "talk_switch", "watch_switch"]
