"""The code every column-partitioned (vertical) protocol shares, SecureBoost's
(``workers.vertical``) and the vertical random forest's (``workers.forest``): PSI alignment and
the public key's delivery (``alignment``), the passive party's lookup table (``lookup``),
opening a party's data (``opening``), federated prediction, batched (``scoring``) and in path
mode (``paths``, with the passive party's ledger of released decisions, ``released``), and the
scoring service's steps (``serving``). It imports no protocol's package: a protocol's own state
reaches it only through what ``scoring`` declares a role must have."""
