"""``python -m vidchat.client``: the documented command. Its command line is
:mod:`vidchat.app.qa_cli`, over the library :mod:`vidchat.qa.client`; this
name stays so the command people learned works."""

import sys

from vidchat.app.qa_cli import client_main as main

if __name__ == "__main__":
    sys.exit(main())
