"""The command-line lists of the models package's commands (bench, accuracy, speculative), as
argparse types: comma-separated names or numbers."""

from __future__ import annotations

import argparse
from typing import Any


def names(text: str) -> list[str]:
    """Comma-separated names, empty ones dropped (the command checks them)."""
    return [t for t in text.split(",") if t]


def ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t]


def listed(choices: tuple[str, ...]) -> Any:
    """A comma-separated list of some of `choices`, each checked here."""

    def parse(text: str) -> list[str]:
        items = text.split(",")
        for name in items:
            if name not in choices:
                raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(choices)}")
        return items

    return parse


def counts(least: int) -> Any:
    """A comma-separated list of integers of at least `least`, each checked here."""

    def parse(text: str) -> list[int]:
        values = []
        for item in text.split(","):
            try:
                count = int(item)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{item!r} is not an integer of at least {least}") from None
            if count < least:
                raise argparse.ArgumentTypeError(f"{item!r} is not an integer of at least {least}")
            values.append(count)
        return values

    return parse
