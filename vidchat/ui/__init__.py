"""The Gradio page: live preview and chat side by side, settings folded away,
and a panel showing exactly what the model was given for the last question.

Browser behaviour (camera, WebRTC) lives in static/vidchat.js. Here:
:mod:`~vidchat.ui.view` (how the chat shows things), :mod:`~vidchat.ui.answers`
(the page's questions and re-asks through vidchat.chat, the same answer path
the WebSocket door uses), :mod:`~vidchat.ui.modes` (Watch and Talk) and
:mod:`~vidchat.ui.layout` (the controls and their events).
"""

from vidchat.ui.answers import clear_chat, page_request, reask, respond, stop_answer
from vidchat.ui.layout import access_mode, hf_page_token, mount, password_page_token
from vidchat.ui.modes import talk_loop, watch_loop
from vidchat.ui.view import NOT_RUNNING, STOPPED, compare_html, history_turns, notice

__all__ = ["NOT_RUNNING", "STOPPED", "access_mode", "clear_chat", "compare_html", "hf_page_token",
           "history_turns", "mount", "notice", "page_request", "password_page_token", "reask", "respond",
           "stop_answer", "talk_loop", "watch_loop"]
