"""From our errors to what a person at a terminal sees: one message line and an exit code.

    0  done
    1  it could not be done now (a proposal not pending any more, a refused decision, a store or
       token problem, a diagnosis that could not be made)
    2  the command was used wrongly or the configuration is wrong: fix the input and run it again
"""

from __future__ import annotations

import sys

from mcp_knecht.errors import ConfigError, KnechtError, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def exit_code(exc: KnechtError) -> int:
    return EXIT_USAGE if isinstance(exc, UsageError | ConfigError) else EXIT_FAILED


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(program: str, exc: KnechtError) -> int:
    """Print `exc` for a person and return the exit code for it."""
    say(f"{program}: {exc.message}")
    return exit_code(exc)
