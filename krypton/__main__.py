"""``python -m krypton``: the command line (:mod:`krypton.cli.main`)."""

import sys

from krypton.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
