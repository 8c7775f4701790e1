"""``python -m vidchat.suite``: QA suites (run, add). Its command line is
:mod:`vidchat.app.qa_cli`, over the library :mod:`vidchat.qa.suite`."""

import sys

from vidchat.app.qa_cli import suite_main as main

if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    sys.exit(main())
