"""The conversation core: what a session does with the model, for every door.

:mod:`~vidchat.conversation.conversation` holds :class:`Conversation` (a
session's chat, its turn, its preemption rule and its event stream);
:mod:`~vidchat.conversation.runs` one answer run; :mod:`~vidchat.conversation.asking`
one question's way to the engine; :mod:`~vidchat.conversation.host` what the core
may use of whoever serves it. docs/how-it-works.md draws the rest.
"""
