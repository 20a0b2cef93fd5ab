"""Prefect flows, one per protocol. Flows send commands to party workers and receive small
control results; they never hold raw data, plaintext gradients, keys or ciphertexts."""
