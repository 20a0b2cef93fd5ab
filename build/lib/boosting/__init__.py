"""Plaintext gradient-boosted trees: the core every federated protocol is checked against.

This package imports nothing else of fedboost. The federated protocols call the same pure
functions (binning, histograms, split finding, leaf weights) that the centralized trainer uses,
which is what makes "lossless" testable.
"""


class BoostingError(ValueError):
    """Invalid data or parameters for the boosting core."""


__all__ = ["BoostingError"]
