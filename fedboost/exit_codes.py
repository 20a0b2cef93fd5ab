"""The ``fedboost`` command's exit statuses (2, a command-line usage error, is argparse's)."""

EXIT_USER_ERROR = 1
"""Bad config, bad data, an empty intersection: one line on stderr names the party and file."""
EXIT_SERVICE_FAILED = 3
"""A long-running service lost a part it cannot serve without (``serve-model``'s scoring
link): it exits for its supervisor to restart it, rather than keep a port that answers 503."""
EXIT_INTERRUPTED = 130
"""Ctrl-C, as shells report a process ended by SIGINT."""
