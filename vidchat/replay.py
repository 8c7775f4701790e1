"""``python -m vidchat.replay``: the documented command. Its command line is
:mod:`vidchat.app.qa_cli`, over the library :mod:`vidchat.qa.replay`; this
name stays so the command people learned works."""

import sys

from vidchat.app.qa_cli import replay_main as main

if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    sys.exit(main())
