"""Entry point of `python3 -m mhapy.report ...`."""

import sys

from .cli import main

sys.exit(main())
