"""fedboost: federated gradient-boosted trees.

``fedboost.train``, ``predict``, ``resume``, ``centralized`` and ``inspect`` are the Python API
(``fedboost.api``); the ``fedboost`` command (``fedboost.cli``) is a thin layer over it.
Importing the package is light: Prefect and the protocols load on first use.
"""

from fedboost.api import (FedboostWarning, PredictResult, TrainResult, TreeRecord, centralized,
                          inspect, predict, resume, train)

__all__ = ["FedboostWarning", "PredictResult", "TrainResult", "TreeRecord", "centralized",
           "inspect", "predict", "resume", "train"]
