"""Vertical SecureBoost (seed 000): an active party with the labels and the Paillier key,
passive parties with other columns of the same customers; PSI, encrypted histograms, lookup
tables, federated prediction."""
