"""Party workers: own a party's data, state and (active party) private key; answer protocol steps."""


class ProtocolError(RuntimeError):
    """A step cannot run: wrong stage, inconsistent peer message."""


class StageError(ProtocolError):
    """A command arrived before the step it depends on."""


class DataError(ValueError):
    """The party's own input (data file, labels) is unusable; the message names file/row/column."""


class NotReady(Exception):
    """A step waits for a peer message that has not arrived yet; the command is retried later."""


__all__ = ["ProtocolError", "StageError", "DataError", "NotReady"]
