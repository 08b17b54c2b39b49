"""Reading the JSON files mhapy is given (result files, --shapes lists, traces), with one wording
for what goes wrong."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def read_json(path: str | Path, error: type[Exception], where: str | None = None):
    """The JSON document at `path` (gzip-compressed when its name ends in .gz). A file that cannot
    be read, is named .gz without being gzip, or is not JSON raises `error` naming `where` (by
    default the path) and why."""
    where = where or str(path)
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return json.load(f)
        return json.loads(path.read_text(encoding="utf-8"))
    except gzip.BadGzipFile:
        raise error(f"{where}: named .gz but not gzip-compressed") from None
    except OSError as e:
        raise error(f"{where}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
