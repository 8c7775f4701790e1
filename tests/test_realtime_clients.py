"""Issue 57 points 18-23: published OpenAI Realtime clients, run unchanged
with their default settings, against the real server on the tiny model:
LiveKit's OpenAI realtime plugin (``livekit-plugins-openai``, its session
driven without a room) and the OpenAI Agents SDK's realtime runner
(``openai-agents``). Each runs in .venv-clients (scripts/setup.sh --test;
the Agents SDK can't sit beside vLLM's websockets) as tests/realtime_clients.py,
which prints the raw server events the package received and what its calls
returned. Shapes, ids and order are checked, never the random model's words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
SCRIPT = Path(__file__).with_name("realtime_clients.py")
INSTRUCTIONS = "You watch a camera. Answer in one short sentence."  # the script's
SYSTEM_NOTE = "The user is in a kitchen."  # the system message LiveKit's chat replay carries
NOT_HONOURED = {"session.audio.input.transcription", "session.audio.input.turn_detection"}


def run_client(scenario: str, srv) -> dict:
    """The scenario's output; a package that raised fails the test with its stderr."""
    if not CLIENTS_PYTHON.exists():
        pytest.fail(f"{CLIENTS_PYTHON} is missing: scripts/setup.sh --test builds it (make test runs that)")
    done = subprocess.run([str(CLIENTS_PYTHON), str(SCRIPT), scenario, srv.url, "tiny"], capture_output=True,
                          text=True, timeout=280, cwd=ROOT)
    sys.stderr.write(done.stderr[-4000:])
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def assistant_items_agree(events: list[dict]) -> None:
    """Point 23: each answer's conversation.item.done names the item before it as its .added did."""
    added = {e["item"]["id"]: e for e in of_type(events, "conversation.item.added")
             if e["item"]["role"] == "assistant" and e["item"]["status"] == "in_progress"}  # answers, not history
    done = [e for e in of_type(events, "conversation.item.done") if e["item"]["id"] in added]
    assert done and len(done) == len(added), (added, done)
    for item_done in done:
        item_added = added[item_done["item"]["id"]]
        assert item_added["previous_item_id"] is not None
        assert item_done["previous_item_id"] == item_added["previous_item_id"], (item_added, item_done)


def check_defaults_applied(updated: dict) -> None:
    """Point 20: the client's default session.update took effect, what can't be honoured left out and named."""
    session = updated["session"]
    assert session["output_modalities"] == ["text"]
    assert session["audio"]["input"]["transcription"] is None
    assert session["audio"]["input"]["turn_detection"] is None  # semantic_vad: not served, turn detection as it was
    assert NOT_HONOURED <= set(updated["vidchat"]["left_out"]), updated.get("vidchat")


@pytest.mark.engine
@pytest.mark.timeout(400)
def test_livekit_plugin_generate_reply_resolves_with_the_sessions_instructions_and_its_replayed_chat(server):
    """Points 18-23 through LiveKit's plugin: its default session.update (transcription,
    semantic_vad) applies; update_instructions; push_video; its chat replay (assistant and
    system messages) is history; generate_reply() resolves (metadata echoed) and streams."""
    out = run_client("livekit", server)
    events = out["events"]
    assert of_type(events, "error") == [], of_type(events, "error")
    first, second = of_type(events, "session.updated")[:2]
    check_defaults_applied(first)
    assert second["session"]["instructions"] == INSTRUCTIONS
    # Point 21: the replayed assistant and system messages are accepted, said back as the API says them.
    history = {e["item"]["role"]: e["item"] for e in of_type(events, "conversation.item.added")
               if e["item"]["role"] in ("assistant", "system") and e["item"]["status"] == "completed"}
    assert history["assistant"]["content"] == [{"type": "output_text", "text": "Yes, I am watching."}]
    assert history["system"]["content"] == [{"type": "input_text", "text": SYSTEM_NOTE}]
    assert out["update_chat_ctx_error"] is None
    # Point 18: generate_reply() found its response (without the metadata it raised "generate_reply timed out").
    assert out["generate_reply_error"] is None
    created, done = of_type(events, "response.created")[0], of_type(events, "response.done")[0]
    metadata = created["response"]["metadata"]
    assert metadata["client_event_id"].startswith("response_create_")
    assert done["response"]["metadata"] == metadata
    assert done["response"]["status"] in ("completed", "incomplete")
    assert out["streamed_text"] == done["response"]["output"][0]["content"][0]["text"]
    # Point 19: generate_reply sends instructions: null, which is the session's; the replayed
    # chat is the history it was asked with (one exchange and the system note) on the frame pushed.
    (record,) = out["records"]
    assert record["system_prompt"] == INSTRUCTIONS
    assert record["history_turns_total"] == 3 and SYSTEM_NOTE in record["prompt"]
    assert record["question"] == "" and record["frames"] == 1
    assistant_items_agree(events)


@pytest.mark.engine
@pytest.mark.timeout(400)
def test_agents_sdk_runner_answers_a_text_message_and_a_picture_alone(server):
    """Points 20, 22, 23 through the Agents SDK's RealtimeRunner with its default model
    settings (audio output, transcription, semantic_vad): the agent's instructions apply;
    send_message of a text and of a picture alone each get their response."""
    out = run_client("agents", server)
    events = out["events"]
    assert of_type(events, "error") == [], of_type(events, "error")
    updated = of_type(events, "session.updated")
    check_defaults_applied(updated[0])
    assert updated[-1]["session"]["instructions"] == INSTRUCTIONS
    assert out["text_message_error"] is None and out["image_message_error"] is None
    done = of_type(events, "response.done")
    assert [d["response"]["status"] in ("completed", "incomplete") for d in done] == [True, True]
    text_record, image_record = out["records"]
    assert text_record["question"] == "What do you see?" and text_record["system_prompt"] == INSTRUCTIONS
    # Point 22: a picture alone is answered on that frame (it got empty_conversation).
    assert image_record["question"] == "" and image_record["frames"] >= 1
    assistant_items_agree(events)
