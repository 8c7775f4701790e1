"""vidchat entry point: `python app.py --help` lists every option."""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from vidchat.settings import parse_settings

    settings = parse_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    log = logging.getLogger("vidchat")

    from vidchat.engine import EngineError
    from vidchat.models import resolve_model, resolve_preset
    from vidchat.presets import apply as apply_preset
    from vidchat.server import create_app, parse_ice_servers
    from vidchat.state import AppState, default_session_settings
    from vidchat.sessions import SessionRegistry

    if settings.model == "list":
        from vidchat.presets import table

        print(table())
        return 0
    try:
        model_path, banner = resolve_model(settings.model, settings.cache_dir)
        preset = resolve_preset(settings.preset or settings.model)
        if settings.preset and preset is None:
            raise ValueError(f"--preset {settings.preset}: no such preset (python app.py --model list shows them)")
        if preset is not None and banner is None:  # not when 'auto' fell back to the tiny model
            settings = apply_preset(settings, preset)
            log.info("preset %s: %s", preset.name, preset.model)
        ice_servers = parse_ice_servers(settings.ice_servers)
    except (EngineError, ValueError) as exc:
        print(f"vidchat: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    state = AppState(
        settings=settings,
        model_path=model_path,
        banner=banner,
        registry=SessionRegistry(settings.max_sessions, lambda: default_session_settings(settings)),
        ice_servers=ice_servers,
    )
    app = create_app(state)
    log.info("starting vidchat with model %s", model_path)
    # A frame of --ws-max-frame-bytes arrives base64-encoded inside JSON: let
    # such a message through so the protocol can answer it, not the transport.
    ws_max_size = settings.ws_max_frame_bytes * 4 // 3 + (1 << 20)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                ws_max_size=ws_max_size)
    return 0 if state.engine is not None else 1


if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    sys.exit(main())
