"""``vidchat``, the command on the PATH: ``vidchat`` (or ``vidchat serve``)
serves with the options of ``python app.py``; ``vidchat replay …``,
``vidchat client …`` and ``vidchat suite …`` are ``python -m
vidchat.replay``, ``python -m vidchat.client`` and ``python -m
vidchat.suite``; ``vidchat --version`` says which vidchat this is."""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Callable, Sequence

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
    from vidchat.qa.replay import main

    return main(argv)


def _client(argv: list[str]) -> int:
    from vidchat.qa.client import main

    return main(argv)


def _suite(argv: list[str]) -> int:
    from vidchat.qa.suite import main

    return main(argv)


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
    from vidchat.app.main import exit_now, main as serve

    # Serving ends by exiting at once once the server has shut down (exit_now says why).
    exit_now(serve(args))
    return 0  # not reached


def run() -> None:
    """The console script."""
    sys.exit(main())
