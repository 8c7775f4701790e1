"""Running as a Hugging Face Space (``SPACE_ID`` set in the environment).

A Space routes its public address to port 7860 of the container and lets no
UDP in, so vidchat there binds to every interface (not loopback) and starts
only with a TURN relay. Sign-in comes from the Space's ``hf_oauth`` (see
vidchat.app.access). The Space card is the README's front matter (docs/hosting.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

from vidchat.app.turn import TurnMinter, has_relay

log = logging.getLogger(__name__)

SPACE_HOST = "0.0.0.0"
LOOPBACK_DEFAULT = "127.0.0.1"


def on_space(env: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if env is None else env).get("SPACE_ID"))


def space_settings(settings: Any, env: Mapping[str, str] | None = None) -> Any:
    """On a Space, the default loopback bind becomes every interface: the
    Space's proxy reaches the container from outside it."""
    if on_space(env) and settings.host == LOOPBACK_DEFAULT:
        log.info("on a Hugging Face Space: binding %s:%d for the Space's proxy", SPACE_HOST, settings.port)
        return dataclasses.replace(settings, host=SPACE_HOST)
    return settings


def check_space_relay(ice_servers: list[dict[str, Any]], turn: TurnMinter | None,
                      env: Mapping[str, str] | None = None) -> None:
    """On a Hugging Face Space (``SPACE_ID`` set) refuse to start without a
    TURN relay: a Space's container takes no inbound UDP, so without one
    every viewer's camera would fail to connect after a long wait."""
    if on_space(env) and turn is None and not any(has_relay(s) for s in ice_servers):
        raise ValueError("this is a Hugging Face Space, which takes no inbound UDP: browsers can reach it only "
                         "through a TURN relay. Set --turn cloudflare (with a Cloudflare TURN key or HF_TOKEN "
                         "as a Space secret) or --ice-servers with a turn: server (VIDCHAT_TURN / "
                         "VIDCHAT_ICE_SERVERS as Space variables)")
