"""Serving vidchat: parse the options, resolve the model, and run the app
under uvicorn until Ctrl-C. ``vidchat`` (``vidchat serve``) and ``python
app.py`` (what a Space runs) both come here.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from vidchat.app.access import Access
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState


def serve(argv: list[str] | None = None) -> int:
    """Parse the options, resolve the model, and serve until Ctrl-C; the exit status."""
    from vidchat.app.settings import parse_settings

    settings = parse_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from vidchat.app.logs import uvicorn_through_root

    uvicorn_through_root()
    if settings.log_format == "json":
        from vidchat.app.logs import use_json_logs

        use_json_logs()
    log = logging.getLogger("vidchat")
    if settings.log_level.lower() != "debug":
        from vidchat.app.logs import quiet_libraries

        quiet_libraries()

    from vidchat.app.settings import space_settings
    from vidchat.engine import EngineError

    settings = space_settings(settings)
    if settings.model == "list":
        from vidchat.app.models import preset_table

        print(preset_table())
        return 0
    try:
        settings, resolved = _resolve(settings, log)
    except (EngineError, ValueError) as exc:
        print(f"vidchat: {exc}", file=sys.stderr)
        return 2

    from vidchat.app.access import build_access, is_loopback

    try:
        access = build_access(settings)
    except ValueError as exc:
        print(f"vidchat: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(settings.host) and not access.required:
        log.warning("bound to %s with no --auth or --token: anyone who can reach this port can use the model "
                    "(see docs/hosting.md)", settings.host)
    return _serve(_app_state(settings, access, resolved), log)


def _resolve(settings: "Settings", log: logging.Logger) -> tuple["Settings", dict[str, Any]]:
    """The settings with the model's preset applied, and what the options
    name resolved: the model and its banner, the compared model, ICE servers
    and the TURN minter. Raises EngineError or ValueError for bad usage."""
    from vidchat.app.ice_servers import minter_from
    from vidchat.app.models import resolve_model, resolve_settings
    from vidchat.app.server import parse_ice_servers
    from vidchat.app.settings import check_space_relay

    settings, model_path, banner = resolve_settings(settings)
    compare_path, compare_banner = (resolve_model(settings.compare_model, settings.cache_dir)
                                    if settings.compare_model else ("", None))
    ice_servers = parse_ice_servers(settings.ice_servers)
    turn = minter_from(settings)
    check_space_relay(ice_servers, turn)
    from vidchat.media.streams import parse_streams

    streams = parse_streams(list(settings.stream), settings.media_dir)
    return settings, dict(model_path=model_path, banner=banner, compare_path=compare_path,
                          compare_banner=compare_banner, ice_servers=ice_servers, turn=turn, streams=streams)


def _app_state(settings: "Settings", access: "Access", resolved: dict[str, Any]) -> "AppState":
    """What the app shares: the session registry and its limits, the answer queue, access, the model."""
    from vidchat.app.access import is_loopback
    from vidchat.app.models import TINY_BANNER
    from vidchat.app.settings import session_time_limit
    from vidchat.app.state import AppState, default_session_settings
    from vidchat.conversation.answers import AnswerQueue
    from vidchat.conversation.registry import SessionRegistry
    from vidchat.media.streams import Streams

    time_limit = session_time_limit(settings)
    bound_to_loopback = is_loopback(settings.host)
    compare_banner = resolved["compare_banner"]
    state = AppState(
        settings=settings,
        model_path=resolved["model_path"],
        banner=resolved["banner"],
        registry=SessionRegistry(
            settings.max_sessions, lambda: default_session_settings(settings),
            max_per_client=settings.max_sessions_per_client,
            # Behind a local reverse proxy every client looks like loopback: only
            # a loopback-bound server exempts loopback clients from the cap.
            uncapped_client=lambda client: bound_to_loopback and is_loopback(client),
            time_limit_s=time_limit,
        ),
        ice_servers=resolved["ice_servers"],
        turn=resolved["turn"],
        access=access,
        answer_gate=AnswerQueue(settings.max_concurrent_answers),
        session_time_limit=time_limit,
        compare_model_path=resolved["compare_path"],
        compare_tiny=bool(compare_banner and compare_banner.startswith(TINY_BANNER)),
        streams=Streams(resolved["streams"], fps=settings.stream_fps),
    )
    # The engine's options before the page is built: the stored frame size
    # (its pixel cap) the page states, the frames-kept limit its slider
    # offers and the sessions' own cap are then one figure from one rule.
    from vidchat.app.engine_keeper import engine_options

    state.engine_options = engine_options(settings, state.model_path, state.tiny)
    return state


def _serve(state: "AppState", log: logging.Logger) -> int:
    """Run the app under uvicorn until Ctrl-C; 0 if the model ran, else 1."""
    import uvicorn

    from vidchat.app.logs import install_log_redaction
    from vidchat.app.server import SHUTDOWN_GRACE_S, ClosingServer, create_app
    from vidchat.app.settings import forwarded_allow_ips, on_space
    from vidchat.doors.page.chat import model_label

    settings = state.settings
    install_log_redaction()
    app = create_app(state)
    log.info("starting vidchat with model %s%s", model_label(state), " (random weights)" if state.tiny else "")
    log.debug("model files: %s", state.model_path)
    # A frame of --ws-max-frame-bytes arrives base64-encoded inside JSON: let
    # such a message through so the protocol can answer it, not the transport.
    ws_max_size = settings.ws_max_frame_bytes * 4 // 3 * 5 // 4 + (1 << 20)
    # The receive queue per connection is bounded by the transport itself:
    # uvicorn's websockets-sansio protocol (the one used when the websockets
    # package is installed) stops reading the socket after each message until
    # the app has taken it, so a client holds at most about one message of
    # ws_max_size in the server. ws="websockets-sansio" pins that choice.
    trusted_proxies = forwarded_allow_ips(settings, on_space())
    if trusted_proxies.replace(" ", "") != "127.0.0.1,::1":
        log.info("client addresses from X-Forwarded-For / Forwarded of proxies at %s", trusted_proxies)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                            ws_max_size=ws_max_size, ws="websockets-sansio", proxy_headers=True,
                            forwarded_allow_ips=trusted_proxies, timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                            # uvicorn's loggers write through the root's handler (logs.uvicorn_through_root).
                            log_config=None)
    try:
        ClosingServer(config, state).run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it handled, once it has shut down
    return 0 if state.engine is not None else 1


def exit_now(code: int) -> None:
    """Exit once the server has shut down (sessions closed, the engine and
    its process gone): skipping the interpreter's teardown of torch and
    vLLM, which took 4-5 s here and kept Ctrl-C from returning promptly."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


# ``vidchat``, the command on the PATH: ``vidchat`` (or ``vidchat serve``)
# serves with the options of ``python app.py``; ``vidchat replay …``,
# ``vidchat client …`` and ``vidchat suite …`` are ``python -m
# vidchat.replay``, ``python -m vidchat.client`` and ``python -m
# vidchat.suite``; ``vidchat --version`` says which vidchat this is.

USAGE = """usage: vidchat [serve] [OPTIONS]      serve the page, the sockets and the model (vidchat --help)
       vidchat replay CLIP [OPTIONS]  a recorded clip or bundles through the same answer path (vidchat replay --help)
       vidchat client [OPTIONS]       a seed-protocol client for a running server (vidchat client --help)
       vidchat suite run|add SUITE …  QA suites: re-run what you found on every model (vidchat suite run --help)
       vidchat --version"""


def version() -> str:
    try:
        return metadata.version("vidchat")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _replay(argv: list[str]) -> int:
    from vidchat.app.qa_cli import replay_main

    return replay_main(argv)


def _client(argv: list[str]) -> int:
    from vidchat.app.qa_cli import client_main

    return client_main(argv)


def _suite(argv: list[str]) -> int:
    from vidchat.app.qa_cli import suite_main

    return suite_main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {"replay": _replay, "client": _client, "suite": _suite}


def main(argv: Sequence[str] | None = None) -> int:
    """The exit status of the command ``argv`` names (serving is the default)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-V"):
        print(f"vidchat {version()}")
        return 0
    if args and args[0] in COMMANDS:
        return COMMANDS[args[0]](args[1:])
    if args and args[0] == "serve":
        args = args[1:]
    elif args and not args[0].startswith("-"):
        print(f"vidchat: unknown command {args[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in args):
        print(USAGE + "\n")

    # Serving ends by exiting at once once the server has shut down (exit_now says why).
    exit_now(serve(args))
    return 0  # not reached


def run() -> None:
    """The console script."""
    sys.exit(main())
