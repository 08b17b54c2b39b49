"""Entry point for `/usr/bin/python3 tools/mha_report ...` (the folder is run as a script)."""

import sys
from pathlib import Path

# Run as a folder, Python puts tools/mha_report itself on sys.path; the package lives in tools/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mha_report.cli import main  # noqa: E402

sys.exit(main())
