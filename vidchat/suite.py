"""``python -m vidchat.suite``: QA suites (run, add). The code is
:mod:`vidchat.qa.suite`."""

import sys

from vidchat.qa.suite import main

if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    sys.exit(main())
