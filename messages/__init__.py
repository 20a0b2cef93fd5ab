"""Wire format and transports. A leaf package: it imports nothing else of fedboost."""


class MessageError(ValueError):
    """A message could not be encoded, decoded or delivered."""


class DecodeError(MessageError):
    """Bytes that are not a valid message of the expected shape."""


class UnknownMessageType(DecodeError):
    """A message kind this version does not know."""


class TransportError(MessageError):
    """The transport failed (lost connection, timeout); retrying may help."""


class StopRequested(TransportError):
    """A stop asked by the process (SIGTERM) ended a wait for an unreachable broker."""


__all__ = ["MessageError", "DecodeError", "UnknownMessageType", "TransportError", "StopRequested"]
