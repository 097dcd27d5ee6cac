"""``python -m streamrl``: the command line."""

import sys

from streamrl.cli.main import main

sys.exit(main())
