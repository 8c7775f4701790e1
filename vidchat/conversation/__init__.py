"""A session's conversation with the model: the one owner of what a session
does with it, for every door (the page, the socket protocol, replay).

A door asks (:meth:`Conversation.ask` for the chat, :meth:`Conversation.reask`
beside it) and gets an :class:`AnswerRun`: a typed stream of events that
mirrors a realtime API's response — :class:`Queued` while it waits for a
place, :class:`Started`, a :class:`Delta` per piece of text, and always one
:class:`Done` last, with its status (``completed``, ``cancelled`` or
``failed``). The run is driven by a task of the conversation from the
moment it is asked (LiveKit's SpeechHandle): it waits for its place,
streams, gives its place back, remembers the answer's inputs and records it
when asked to, and ends with its Done whether anyone reads it or not. Doors
listen (:meth:`AnswerRun.events`) and only turn the events into their wire
format; a door that leaves unsubscribes, and when the last one leaves before
the Done the answer is cancelled. :meth:`AnswerRun.cancel` is the one way to
stop it; a cancelled run whose engine does not let go is force-done after
CANCEL_GRACE_S.

An answer is *over* once its Done has been taken by every reader
(:attr:`AnswerRun.over`; at once when nobody reads it). The one preemption
rule: a newer question in the chat (any door, any kind: typed, spoken,
watched) cancels the running answer, and the newer run starts only once the
older one is over (a reader that stopped reading holds it at most
PREEMPT_GRACE_S). A re-ask runs beside the chat (its own slot): it never
cancels the chat's answer, is never kept among the chat's answers, and so is
never read aloud nor offered as chat history. The slots, and the turn each
question takes in its slot, are vidchat.conversation.answers'.
"""
