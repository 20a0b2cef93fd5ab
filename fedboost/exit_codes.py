"""The ``fedboost`` command's exit statuses (2, a command-line usage error, is argparse's)."""

EXIT_USER_ERROR = 1
"""Bad config, bad data, an empty intersection: one line on stderr names the party and file."""
EXIT_INTERRUPTED = 130
"""Ctrl-C, as shells report a process ended by SIGINT."""
