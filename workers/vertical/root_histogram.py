"""A tree's gradients as they arrive at a passive party: each chunk parsed and range-checked
once, and summed into the root's encrypted histograms at once (SecureBoost Alg. 1 lines 4-9
at depth 0, overlapped with the transfer).

The root holds every in-tree row, and chunk ``k`` of E(g, h, 1) holds the in-tree rows from
``k x size`` on, in row order (the last chunk ends at the last row). So each chunk's rows are
known when it lands, and their ciphertexts multiply into every feature's bin products there
and then: over a WAN the root's sums are ready when the last chunk is in, not one pass over
every row later. Products modulo the ciphertext modulus do not depend on their order, so the
sums, and the model, are those of one pass over the rows.

Summed here only when the party has no helper processes (counted once a tree, as its start
arrives): with helpers, the root's features are shared among the processes as every level's
are (``workers.vertical.histograms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from boosting.fixedpoint import value_bits
from crypto._gmp import mpz
from crypto.bin_products import bin_products
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import PublicKey, ciphertexts_from_bytes
from messages.instance_space import decode_mask
from messages.secureboost import EncryptedGradients, TreeStart
from workers import ProtocolError
from workers.policy import PartyPolicy, check_bin_sum_packer


@dataclass(slots=True)
class ArrivingTree:
    """The chunks of one tree's gradients that are in so far, and the root's sums of them."""

    start: TreeStart
    in_tree: np.ndarray
    """Per training row: in the tree (the start's instance space)."""
    in_tree_rows: np.ndarray
    """The in-tree rows' indices, in the chunks' order."""
    packing: BinSumPacking
    helpers: int
    """The party's helper processes when the tree started: its root and chunks are for them."""
    parsed: dict[int, list[mpz]] = field(default_factory=dict)
    """Chunk number -> its ciphertexts, parsed and range-checked."""
    root_sums: list[mpz] | None = None
    """Per feature and bin, the product of the in-tree ciphertexts in so far (1: none yet);
    None when helpers share the root."""
    chunk_size: int = 0
    """Ciphertexts in each chunk but the last (0: none of those is in yet)."""

    @property
    def tree(self) -> int:
        return self.start.tree

    @property
    def rows(self) -> int:
        return int(self.in_tree_rows.size)


def check_tree_start(start: TreeStart, n_train: int, public: PublicKey, private: bool,
                     policy: PartyPolicy, party: str) -> ArrivingTree:
    """Everything a tree's start declares, checked before any of its chunks is taken."""
    tree = start.tree
    # the shape the active party declares is the one honest gradients of this party's rows
    # have: it sets how wide each bin sum is, so how much of each a decryption shows
    if start.max_rows != n_train or start.value_bits != value_bits(n_train) \
            or not 0 <= start.n_chunks <= n_train:
        raise ProtocolError(f"tree {tree}: gradients of {start.value_bits} bits for "
                            f"{start.max_rows} rows in {start.n_chunks} chunks; this party has "
                            f"{n_train} rows, whose gradients have {value_bits(n_train)} bits")
    in_tree = decode_mask(start.in_tree, n_train)
    _check_tree_rows(tree, private, in_tree, start.n_chunks)
    most = BinSumPacking.for_key(GradientPacker(start.value_bits, start.max_rows).cell_bits,
                                 public.plaintext_bits)
    if start.per_ciphertext not in (1, most.per_ciphertext):
        raise ProtocolError(f"tree {tree}: asked to pack {start.per_ciphertext} bin sums per "
                            f"ciphertext; 1 (the key holder folds) or {most.per_ciphertext}")
    if start.per_ciphertext == 1:
        check_bin_sum_packer(policy, party, "key_holder",
                             f"tree {tree} asks for one bin sum per ciphertext")
    return ArrivingTree(start, in_tree, np.flatnonzero(in_tree),
                        BinSumPacking(most.cell_bits, start.per_ciphertext), helpers=0)


def _check_tree_rows(tree: int, private: bool, in_tree: np.ndarray, n_chunks: int) -> None:
    """A tree's gradients come in at least one chunk, except those of a tree of no rows, which
    only a job under DP grows: its rows are dealt to the trees of an ensemble with shares
    ``eta (1 - eta)^t``, and the last trees may get none. Such a tree sums nothing of this
    party's (its histograms are empty), so it shows nothing; without DP an honest active party
    never starts one, and its chunks' absence is refused as before."""
    if n_chunks == 0 and not private:
        raise ProtocolError(f"tree {tree}: gradients in 0 chunks; only a job under "
                            f"differential privacy grows a tree of no rows")
    if (n_chunks == 0) != (not in_tree.any()):
        raise ProtocolError(f"tree {tree}: gradients in {n_chunks} chunks for "
                            f"{int(in_tree.sum())} in-tree rows")


def add_chunks(arrival: ArrivingTree, chunks: list[EncryptedGradients], bins: np.ndarray,
               public: PublicKey, n_bins: int) -> None:
    """Parse, range-check and (without helpers) sum into the root the chunks not yet in."""
    for chunk in chunks:
        if chunk.chunk in arrival.parsed:
            continue
        parsed = ciphertexts_from_bytes(chunk.ciphertexts, public)
        first = _first_row(arrival, chunk.chunk, len(parsed))
        if arrival.root_sums is not None and parsed:
            rows = arrival.in_tree_rows[first:first + len(parsed)]
            products = bin_products(bins[rows], np.arange(len(parsed)), parsed, n_bins,
                                    public.cipher_modulus)
            modulus = public.cipher_modulus
            arrival.root_sums = [b if a == 1 else a if b == 1 else a * b % modulus
                                 for a, b in zip(arrival.root_sums, products, strict=True)]
        arrival.parsed[chunk.chunk] = parsed


def _first_row(arrival: ArrivingTree, k: int, size: int) -> int:
    """Where chunk ``k``'s ciphertexts start among the in-tree rows; a chunk that cannot be
    where it says is refused (every chunk but the last of one size, the last ending the rows)."""
    n_chunks, rows = arrival.start.n_chunks, arrival.rows
    if not 0 <= k < n_chunks:
        raise ProtocolError(f"tree {arrival.tree}: gradient chunk {k} of {n_chunks}")
    last = k == n_chunks - 1
    if not last and arrival.chunk_size and size != arrival.chunk_size:
        raise ProtocolError(f"tree {arrival.tree}: gradient chunk {k} holds {size} "
                            f"ciphertexts, an earlier one {arrival.chunk_size}")
    first = rows - size if last else k * size
    if first < 0 or first + size > rows or size == 0:
        raise ProtocolError(f"tree {arrival.tree}: gradient chunk {k} of {size} ciphertexts "
                            f"does not fit {rows} in-tree rows")
    if not last:  # only a chunk that fits sets the size the others must have
        arrival.chunk_size = size
    return first


def in_order(arrival: ArrivingTree) -> list[mpz]:
    """Every in-tree row's ciphertext, in row order, once every chunk is in and they tile the
    rows exactly."""
    n_chunks = arrival.start.n_chunks
    if sorted(arrival.parsed) != list(range(n_chunks)):
        raise ProtocolError(f"tree {arrival.tree}: gradient chunks {sorted(arrival.parsed)}")
    count = sum(len(c) for c in arrival.parsed.values())
    if count != arrival.rows or (n_chunks > 1 and (n_chunks - 1) * arrival.chunk_size
                                 != count - len(arrival.parsed[n_chunks - 1])):
        raise ProtocolError(f"tree {arrival.tree}: {count} ciphertexts for {arrival.rows} rows "
                            f"(in {n_chunks} chunks)")
    ordered: list[mpz] = []
    for k in range(n_chunks):
        ordered += arrival.parsed[k]
    return ordered
