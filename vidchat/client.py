"""``python -m vidchat.client``: the documented command. The code is
:mod:`vidchat.qa.client`; this name stays so the command people learned works."""

import sys

from vidchat.qa.client import main

if __name__ == "__main__":
    sys.exit(main())
