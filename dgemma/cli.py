"""Command-line plumbing shared by every entry point: one clear line on bad input, exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from dgemma.errors import first_line
from dgemma.units import parse_size


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse type for counts (requests, tokens, ports): a whole number of at least 1, else argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def size_arg(text: str) -> int:
    """argparse type for sizes such as 8GiB, in bytes; a malformed one becomes argparse's one-line error."""
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None,
            prog: str | None = None) -> NoReturn:
    """Run `main`, turning expected failures (bad values, out of memory, missing files) into
    one line on stderr and a non-zero exit instead of a traceback."""
    import torch

    prog = prog or argparse.ArgumentParser().prog
    try:
        code = main(argv)
    except (ValueError, OSError, torch.OutOfMemoryError) as err:  # OSError: FileNotFoundError's too
        print(f"{prog}: error: {first_line(err)}", file=sys.stderr)
        sys.exit(3 if isinstance(err, torch.OutOfMemoryError) else 2)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code or 0)
