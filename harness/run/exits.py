"""The exit codes of every ``kvspec`` command, defined once.

0 nothing found (or every check passed); 1 a finding, a report written (``kvspec mutants``: a mutant
survived; ``kvspec replay``: a trace departed from its record); 2 bad usage, a bad file, or a target that
cannot be loaded; 3 a search stopped before a verdict (``kvspec pd verify``); 4 the run checked
nothing (no operation was checked: every family refused, or no example finished in time), never a
silent 0; ``128 + signal`` after SIGINT (130) or SIGTERM (143), once what was found is written.
"""

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3
EXIT_UNCHECKED = 4


def exit_on_signal(signum: int) -> int:
    """The exit status of a run stopped by signal ``signum``: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum
