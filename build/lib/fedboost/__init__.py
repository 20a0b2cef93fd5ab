"""fedboost: federated gradient-boosted trees.

``fedboost.train``, ``predict``, ``resume``, ``centralized``, ``inspect`` and ``report`` are the
Python API
(``fedboost.api``); the ``fedboost`` command (``fedboost.cli``) is a thin layer over it.
Importing the package is light: Prefect and the protocols load on first use.
"""

from fedboost.api import (FedboostWarning, PredictResult, TrainResult, TreeRecord, centralized,
                          inspect, predict, report, resume, train)

__all__ = ["FedboostWarning", "PredictResult", "TrainResult", "TreeRecord", "centralized",
           "inspect", "predict", "report", "resume", "train"]
