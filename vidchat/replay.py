"""``python -m vidchat.replay``: the documented command. The code is
:mod:`vidchat.qa.replay`; this name stays so the command people learned works."""

import sys

from vidchat.qa.replay import main

if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    sys.exit(main())
