"""fedboost: federated gradient-boosted trees. This package is the command-line edge."""
