"""Every server option in one place.

Each option is a dataclass field carrying its help text; the command-line flag
is the field name with dashes, and the environment variable is ``VIDCHAT_`` +
the field name upper-cased. Precedence: flag > environment > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vidchat.app.ice_servers import TurnMinter, has_relay
from vidchat.conversation.memory import DEFAULT_MEMORY_PROMPT
from vidchat.media import DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_PIXELS, FRAMES_AS
from vidchat.media.session import MAX_AUDIO_SECONDS, SAMPLING_STRATEGIES

log = logging.getLogger(__name__)


ENV_PREFIX = "VIDCHAT_"


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class ModelSettings:
    """The options that say which model runs and how its engine is sized.

    Settings' first fields: a base's fields come first, so ``--help`` and
    docs/options.md list them in the same order as one class would.
    """

    # --- model / engine -------------------------------------------------
    model: str = _opt(
        "auto",
        "A preset name ('list' prints them), a model folder or a Hugging Face id. "
        "'tiny' builds a random-weight test model (replies are gibberish); 'tiny-vl' "
        "the vision-only one; 'auto' picks a preset for the hardware (qwen2.5-omni-3b "
        "on GPU, smolvlm2-256m on CPU) and falls back to 'tiny' when it cannot be loaded.",
    )
    preset: str = _opt(
        "", "Apply a preset's limits (see --model list) to the model --model names: for a local copy of a "
        "preset's weights, e.g. --model /models/SmolVLM2-256M --preset smolvlm2-256m.",
    )
    compare_model: str = _opt(
        "", "A second model (same forms as --model) loaded beside the first, so the page's Re-ask can put one "
        "answer's exact inputs to both models. Needs memory for both engines; empty: one model.",
    )
    dtype: str = _opt("auto", "Weights/activation dtype passed to vLLM (auto, bfloat16, float16, float32).")
    max_model_len: int = _opt(8192, "Longest prompt + reply in tokens.")
    kv_cache_gb: float = _opt(
        1.0, "KV-cache size in GiB on CPU (set explicitly: vLLM otherwise reserves most of the RAM)."
    )
    mm_cache_gb: float = _opt(
        1.0, "GiB vLLM may keep of processed frames for reuse (its mm_processor_cache_gb, 4 by default). Live "
        "video makes nearly every frame new, so this is memory the server grows into; 0 turns the cache off.",
    )
    gpu_memory_utilization: float = _opt(0.85, "Fraction of GPU memory vLLM may use (GPU only).")
    engine_url: str = _opt(
        "", "Use a remote vLLM server (e.g. 'http://gpu-host:8000' of `vllm serve MODEL`) instead of the "
        "in-process engine: same page, protocol and records; --model then only names the model for its "
        "processor (default: the served model's name). Engine sizing options are the server's own. A router "
        "(vllm-router --policy consistent_hash) is one URL; several URLs, comma separated "
        "('http://a:8000,http://b:8000'), are replicas vidchat itself spreads sessions over by consistent "
        "hashing, each session pinned to one (docs/hosting.md, 'Beyond one machine').",
    )
    engine_session_header: str = _opt(
        "X-Session-ID", "With --engine-url: the header that carries each session's routing key (an opaque hash, "
        "the same on every request and warm-up of a session) for a router's session affinity.",
    )
    engine_connect_timeout: float = _opt(5.0, "With --engine-url: seconds to connect to a model server; one "
                                         "that refuses or times out is skipped while others answer.")
    engine_first_byte_timeout: float = _opt(
        60.0, "With --engine-url: seconds a model server may take to start answering, and may then stay silent "
        "mid-answer, before the answer ends with an error (a hung replica never holds a session).",
    )
    tensor_parallel_size: int = _opt(1, "GPUs one copy of the model is split across (vLLM's "
                                     "--tensor-parallel-size): for a model too large for one GPU.")
    data_parallel_size: int = _opt(1, "Copies of the model vLLM runs side by side in this process's engine "
                                   "(vLLM's --data-parallel-size), each on its own GPUs: more concurrent "
                                   "sessions on one machine. Needs tensor x data parallel GPUs.")
    max_images: int = _opt(32, "Most images one prompt may carry (vLLM limit_mm_per_prompt).")
    max_videos: int = _opt(1, "Most videos one prompt may carry.")
    max_audios: int = _opt(1, "Most audio clips one prompt may carry (omni models only; at least 16 with "
                               "--audio-segments on).")
    audio_segments: str = _opt(
        "off", "Send a question's audio as 2-s segments, one clip each, named per session, instead of one clip: "
        "a finished segment is then encoded and prefilled once, and warm-ups can take it. Off by default: on "
        "CPU, vLLM 0.32's per-clip cost for Qwen2.5-Omni outweighed the prefill it saves (docs/performance.md, 'Warm-ups').",
        choices=("off", "on"),
    )
    max_image_pixels: int = _opt(
        0,
        "Cap on pixels per frame given to the model's processor (0: the model's own "
        "setting; 'tiny' uses 224x224).",
    )
    cache_dir: str = _opt(
        os.path.join(os.path.expanduser("~"), ".cache", "vidchat"),
        "Where the tiny test model is built on first use.",
    )


@dataclass
class Settings(ModelSettings):
    """Every server option: the model's (ModelSettings), then the rest."""

    # --- answers ----------------------------------------------------------
    frames_per_question: int = _opt(16, "Frames sampled from the buffer for each question (the page and "
                                    "the WebSocket protocol can change it per session).")
    sampling: str = _opt(
        "uniform", "Which kept frames a question takes (the page and the WebSocket protocol can change it per "
        "session): 'uniform' spreads them over the buffer; 'stable' spreads them too, but a new frame changes "
        "only the newest pick, so the engine has encoded every frame but one (the SmolVLM presets' default: "
        "docs/performance.md, 'One new frame a question'); 'latest_frames', 'latest_seconds'.",
        choices=SAMPLING_STRATEGIES)
    frames_as: str = _opt("images", "Send sampled frames as separate 'images' or as one 'video'.", choices=FRAMES_AS)
    max_tokens: int = _opt(256, "Longest reply in tokens.")
    temperature: float = _opt(0.7, "Sampling temperature (0 = greedy).")
    system_prompt: str = _opt(
        "You are a helpful assistant watching a live video. Answer about what you see and hear.",
        "System prompt put before every conversation.",
    )
    prewarm: str = _opt(
        "auto", "Keep each session's next question prefilled in the engine (vidchat/conversation/warmup.py): 'idle' sends "
        "warm-ups only while no answer is generating, 'always' also beside answers (at lower priority), 'off' "
        "never. With warm-ups on, the page's Enter also has the server take the question's frames and audio at "
        "once and warm them while the question travels. 'auto' (the default) times one encode of a stored-size "
        "frame at start-up: above 150 ms a frame (a CPU) it chooses 'idle': each session's newest kept frame is "
        "encoded as it arrives, one frame at a time, from the moment the camera starts, and a question brings at "
        "most one new frame (docs/performance.md, 'One new frame a question'); below (the tiny model, a GPU) "
        "'off'. The start-up log and /api/health say which mode runs and why.",
        choices=("auto", "off", "idle", "always"),
    )
    memory: str = _opt(
        "auto", "Live sessions that remember (docs/memory.md): each scene's first frame is kept in a scene log "
        "(--memory-keyframes), the engine captions it while idle, and every question carries the captions and, "
        "when it points at a time ('two minutes ago', 'at the start'), that time's keyframes. 'auto' turns it on "
        "where the engine runs on a GPU and off on a CPU, where a caption holds the engine for a frame's encoding "
        "that an arriving question cannot cut short. Each session can turn it on or off (the 'memory' setting).",
        choices=("auto", "on", "off"),
    )
    memory_keyframes: int = _opt(256, "Keyframes a session's scene log keeps; past it the log thins its older "
                                 "half (every second keyframe goes), so it always spans the whole session.")
    memory_prompt: str = _opt(DEFAULT_MEMORY_PROMPT, "The instruction each keyframe is captioned with.")
    memory_caption_tokens: int = _opt(48, "Longest caption in tokens.")
    memory_tokens: int = _opt(512, "Most tokens of captions one question's prompt carries (newest first).")
    memory_frames: int = _opt(2, "Most keyframes a question that points at a time gets beside its live frames.")
    record_dir: str = _opt(
        "", "Save every answer as a recording bundle (its frames as PNG, audio as WAV, question, chat history, "
        "settings, prompt, answer, timings; layout in vidchat/conversation/bundles.py) in a new folder under this one, "
        "for every session at every door unless it turns recording off for itself (the page's 'Record each answer' "
        "tick, a socket's record: false). Empty: recording is off; nothing is written to disk unless this is set.",
    )
    suite_dir: str = _opt(
        "", "A QA suite's folder (docs/suites.md): each answer's 'What the model got' panel offers Add to suite, "
        "which saves the answer's bundle under DIR/bundles/, adds a case re-asking it to DIR/suite.toml and keeps "
        "its answer as this model's baseline. Empty: no Add to suite; nothing is written.",
    )
    suite_keep_runs: int = _opt(
        20, "Run folders kept under the suite's runs/ (each holds a run's reports and a recording bundle per ask): "
        "after each run, from the page or `vidchat suite run` without --out, the oldest beyond this many are "
        "deleted, so the disk does not grow with every run. 0: keep every run.",
    )
    suite_max_cases: int = _opt(
        500, "Cases one login may have in the suite by Add to suite (each brings a recording bundle under "
        "DIR/bundles/): past it, Add to suite is refused (403) saying so, until cases it added are removed from "
        "DIR/suite.toml. Without a login (loopback, no --token/--auth) every caller shares one allowance.",
    )
    # --- server -------------------------------------------------------
    host: str = _opt("127.0.0.1", "Address to bind. Use 0.0.0.0 only when you mean to expose the app.")
    port: int = _opt(7860, "TCP port for the page, the WebRTC offer endpoint and the WebSocket protocol.")
    log_level: str = _opt("info", "Logging level (debug, info, warning, error).")
    log_format: str = _opt("console", "How log lines look: console (for a person) or json (one object per "
                           "line: time, level, logger, message, and session, door, answer_id where there is one).",
                           choices=("console", "json"))
    engine_restarts: int = _opt(3, "Times an hour the in-process engine (and --compare-model's) is started again "
                                "after it dies (an OOM, a CUDA error, its process killed), 2 s, 4 s, 8 s … apart; "
                                "past that it stays down and says why. 0: never.")
    # --- sessions -------------------------------------------------------
    max_sessions: int = _opt(16, "Most concurrent sessions (browser tabs + WebSocket clients). vLLM's encoder "
                             "cache is sized to hold one sample per session (tokens per frame x frames per "
                             "question x this; on CPU 2,048 tokens unless that needs more, at most 65,536), so "
                             "a session's frames, once encoded, are not encoded again for its next question.")
    session_idle_timeout: float = _opt(
        30.0, "End a WebRTC session whose newest frame or audio is older than this (seconds); until then a "
        "tab whose connection dropped can re-attach to it.",
    )
    # --- seed WebSocket protocol --------------------------------------
    ws_idle_timeout: float = _opt(60.0, "WebSocket protocol: close a session after this many seconds without a message.")
    ws_config_timeout: float = _opt(10.0, "WebSocket protocol: seconds a client has to send session.config.")
    ws_max_frame_bytes: int = _opt(DEFAULT_MAX_FRAME_BYTES, "Largest encoded frame a session accepts, in bytes (the WebSocket protocol's JPEG frames).")
    max_frame_pixels: int = _opt(
        DEFAULT_MAX_FRAME_PIXELS, "Largest encoded frame (JPEG, PNG or WebP) a session accepts, in pixels (width x "
        "height), read from the image header before decoding: protects memory and CPU from image bombs, small "
        "files that decode to huge pictures.",
    )
    ws_send_timeout: float = _opt(
        10.0, "Socket doors: a client that reads nothing for this many seconds while messages wait for it "
        "(its outbound queue full, or one send stuck) is closed with 1008; frame acks are dropped first.",
    )
    ws_max_audio_seconds: float = _opt(30.0, "Socket doors (WebSocket protocol, Realtime API): most seconds of audio kept per session, and of a spoken question (at most 600).")
    ws_max_fps: float = _opt(
        60.0, "Socket doors (WebSocket protocol, Realtime API): most frames a session takes in a second, in bursts "
        "of up to a second's worth; frames above it are dropped before they are decoded (the seed's ack says "
        "reason 'rate', the Realtime door's error code is 'rate') and counted (the seed's video.done answers "
        "them as response.evs_stats.rate_dropped_count), so one client cannot make the server decode thousands of "
        "frames a second.",
    )
    # --- WebRTC -------------------------------------------------------
    ice_servers: str = _opt(
        "",
        "JSON list of RTCIceServer dicts given to browsers and the server peer "
        '(e.g. [{"urls": "turn:turn.example:3478", "username": "u", "credential": "p"}]). '
        "Empty on localhost.",
    )

    turn: str = _opt(
        "off", "Short-lived TURN credentials for browsers behind NAT: 'cloudflare' mints them per Start camera "
        "from a Cloudflare TURN key (TURN_KEY_ID + TURN_KEY_API_TOKEN) or HF_TOKEN in the environment, "
        "cached until shortly before expiry. --ice-servers stays for static servers (coturn, Twilio).",
        choices=("off", "cloudflare"),
    )
    turn_ttl: int = _opt(3600, "Lifetime of minted TURN credentials, in seconds.")
    turn_api_url: str = _opt("https://rtc.live.cloudflare.com/v1/turn/keys",
                             "Cloudflare's TURN key API (changed only to test against a stand-in).")
    turn_hf_url: str = _opt("https://turn.fastrtc.org/credentials",
                            "The TURN credential service reached with HF_TOKEN (FastRTC's).")

    media_dir: str = _opt(
        "", "A folder of video files the page lists as sources (played in the browser, sent like a camera). "
        "Only files directly in it are served; empty: none.",
    )
    stream: tuple = _opt(
        (), "A live stream as a source, NAME=URL (docs/streams.md): rtsp://, rtsps://, http(s):// (HLS .m3u8, "
        "MJPEG, MP4/TS) or a file under --media-dir. Pulled once by the server while a session watches it and "
        "shared by every session that does; only the operator names streams (no client gives a URL). "
        "Credentials in a URL are never logged or shown. Repeat the flag for more; the variable takes them "
        "separated by spaces.", repeat=True,
    )
    stream_fps: float = _opt(10.0, "At most this many frames a second of each stream are converted and offered "
                             "to its sessions (the frames between are skipped before conversion).")
    # --- access (see docs/hosting.md) ------------------------------------
    auth: tuple = _opt(
        (), "Page login: USER:PASSWORD, or a file with one such line per user. Repeat the flag for more users; "
        "the variable takes them separated by spaces.", repeat=True,
    )
    token: str = _opt(
        "", "Token programs must present (Authorization: Bearer, or ?token= on the WebSocket URL) on every route "
        "that is not public (vidchat/app/access.py PUBLIC_ROUTES: the page shell, logins, health checks): the "
        "WebSocket protocol, /webrtc/*, /api/*, /inputs/*, the page's /gradio_api/*. It is also what the operator "
        "routes (/api/drain, /api/prewarm, /api/loop-lag/reset) take from another machine. Without --auth, the "
        "page's login takes it as the password.",
    )
    hf_oauth: str = _opt(
        "auto", "Hugging Face sign-in for the page: 'auto' turns it on inside a Space with hf_oauth enabled.",
        choices=("auto", "on", "off"),
    )
    hf_users: str = _opt("", "With Hugging Face sign-in: the user names allowed in (comma separated; empty: anyone "
                         "signed in). Anyone else signed in is refused (403) on the page's API and every "
                         "guarded route.")
    allowed_origins: str = _opt(
        "", "Other web origins (e.g. https://my.site) whose pages may send this server any request but GET or HEAD: "
        "WebSocket sessions, /webrtc/*, the page's API (/gradio_api/*, uploads included) and the operator routes; "
        "'*' allows any. This server's own page is always allowed, and so are requests without an Origin header "
        "(programs).",
    )
    forwarded_allow_ips: str = _opt(
        "", "Addresses of reverse proxies (nginx, Traefik, the Space's) whose X-Forwarded-For / Forwarded headers "
        "name the real client (comma separated; '*' any), passed to uvicorn: per-client caps, logs and the "
        "loopback checks then see the client, not the proxy. Empty: 127.0.0.1 and ::1 (a proxy on this machine), "
        "and '*' on a Hugging Face Space, whose container only its proxy can reach.",
    )
    allowed_hosts: str = _opt(
        "", "Host names this server answers to (comma separated; '*' any). Empty: only localhost names when bound "
        "to a loopback address (this is what defeats DNS rebinding), any host otherwise.",
    )
    # --- limits ---------------------------------------------------------
    max_body_bytes: int = _opt(
        1 << 20, "Largest request body of the page's API (/gradio_api/* but its file upload), in bytes: a question "
        "and the settings it is asked with (a question at its longest, 64 Ki characters, is 768 KiB even with "
        "every character JSON-escaped); larger gets 413 before anything of it is parsed, and large bodies are "
        "parsed off the event loop. Every other route has the bound its content needs (a WebRTC offer 64 KiB, "
        "any other request 64 KiB: docs/hosting.md); uploads are bounded by --max-upload-mb instead.",
    )
    max_upload_mb: float = _opt(
        64.0, "Uploads one login keeps on the server at once (files sent to the page's /gradio_api/upload, such as "
        "a bundle to re-ask), in MB (2^20 bytes); without credentials, per client address. An upload counts until "
        "it is deleted: a bundle once it is read, any other within 20 minutes (Gradio's cache cleaning). One that "
        "would pass this gets 413 naming it; 0: no uploads.",
    )
    connect_timeout: float = _opt(
        15.0, "Seconds a WebRTC offer has to become a connected peer; a session that never connects is ended "
        "and its place freed.",
    )
    max_sessions_per_client: int = _opt(
        4, "Most concurrent sessions from one client address (0: no cap). Loopback clients are not capped while "
        "the server is bound to a loopback address.",
    )
    session_time_limit: float = _opt(
        -1.0, "End every session this many seconds after it starts (0: never). -1: never when bound to a "
        "loopback address, 1800 otherwise. The page shows a countdown; the WebSocket protocol announces the end.",
    )
    max_session_mb: float = _opt(
        0.0, "Memory one session's frame buffer may take, in MB (2^20 bytes): max_frames x the stored frame size "
        "(width x height x 3) must fit, else session.config, session.update and the page get an error naming "
        "this budget. 0: what 64 frames at the stored size need (a little over 15 MB at 320x240).",
    )
    max_concurrent_answers: int = _opt(
        8, "Answers generated at once across all sessions (0: no cap); later questions wait in a fair queue "
        "and are told their place.",
    )

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def _coerce(kind: type, raw: str) -> Any:
    if kind is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return kind(raw)


def build_parser() -> argparse.ArgumentParser:
    # No prog: the usage line says how it was started (`vidchat` or `app.py`).
    parser = argparse.ArgumentParser(
        description="vidchat: live video chat with a vision-language model.",
        epilog=f"Every option can also be set by an environment variable {ENV_PREFIX}<OPTION> "
        f"(e.g. {ENV_PREFIX}PORT=8000); a flag wins over the variable.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    hints = {f.name: f for f in dataclasses.fields(Settings)}
    for name, f in hints.items():
        kind = type(f.default)
        env_name = ENV_PREFIX + name.upper()
        default = f.default
        if env_name in os.environ and not f.metadata.get("repeat"):
            try:
                default = _coerce(kind, os.environ[env_name])
            except ValueError:
                parser.error(f"{env_name}={os.environ[env_name]!r} is not a valid {kind.__name__}")
        kwargs: dict[str, Any] = {"default": default, "help": f.metadata["help"] + f" [env {env_name}]"}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("repeat"):
            kwargs["default"] = None  # flags replace the variable's list (parse_settings)
            parser.add_argument("--" + name.replace("_", "-"), action="append", **kwargs)
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=kind, **kwargs)
    return parser


# Limits that make no sense at zero or below: refused at start-up with the
# flag's name, instead of failing every session later.
AT_LEAST = {"max_sessions": 1, "max_frame_pixels": 1, "max_body_bytes": 1024, "ws_max_frame_bytes": 1024,
            "max_sessions_per_client": 0, "max_concurrent_answers": 0, "connect_timeout": 0,
            "session_idle_timeout": 1, "ws_idle_timeout": 1, "ws_config_timeout": 0.1,
            "ws_send_timeout": 0.5, "ws_max_fps": 1, "tensor_parallel_size": 1, "data_parallel_size": 1, "turn_ttl": 60,
            "max_session_mb": 0, "engine_connect_timeout": 0.1, "engine_first_byte_timeout": 0.1,
            "ws_max_audio_seconds": 0.1, "max_upload_mb": 0, "engine_restarts": 0, "stream_fps": 0.1,
            "suite_keep_runs": 0, "suite_max_cases": 1, "memory_keyframes": 2, "memory_caption_tokens": 1,
            "memory_tokens": 1, "memory_frames": 0}

# And above: a session keeps at most MAX_AUDIO_SECONDS of audio, at every door.
AT_MOST = {"ws_max_audio_seconds": MAX_AUDIO_SECONDS}


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    parser = build_parser()
    return settings_from_args(parser, parser.parse_args(argv))


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    """Settings from arguments parsed by ``parser`` (build_parser's, or one
    built on it with options of its own, which are ignored here): the AT_LEAST
    checks (``parser.error`` names the flag) and repeat options read from the
    environment when no flag gave them."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)}
    for name, least in AT_LEAST.items():
        if values[name] < least:
            parser.error(f"--{name.replace('_', '-')} must be at least {least}, got {values[name]}")
    for name, most in AT_MOST.items():
        if values[name] > most:
            parser.error(f"--{name.replace('_', '-')} must be at most {most:g}, got {values[name]}")
    for f in dataclasses.fields(Settings):
        if f.metadata.get("repeat") and values[f.name] is None:
            values[f.name] = tuple(os.environ.get(ENV_PREFIX + f.name.upper(), "").split())
        elif f.metadata.get("repeat"):
            values[f.name] = tuple(values[f.name])
    return Settings(**values)


def forwarded_allow_ips(settings: Settings, on_space: bool) -> str:
    """--forwarded-allow-ips resolved, as uvicorn takes it."""
    if settings.forwarded_allow_ips.strip():
        return settings.forwarded_allow_ips
    return "*" if on_space else "127.0.0.1,::1"


def session_time_limit(settings: Settings) -> float:
    """--session-time-limit resolved: seconds, 0 for none."""
    from vidchat.app.access import is_loopback

    if settings.session_time_limit >= 0:
        return settings.session_time_limit
    return 0.0 if is_loopback(settings.host) else 1800.0


# Running as a Hugging Face Space (``SPACE_ID`` set in the environment).
#
# A Space routes its public address to port 7860 of the container and lets no
# UDP in, so vidchat there binds to every interface (not loopback) and starts
# only with a TURN relay. Sign-in comes from the Space's ``hf_oauth`` (see
# vidchat.app.access). The Space card is the README's front matter (docs/hosting.md).

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
