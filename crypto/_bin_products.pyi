# The C kernel's signatures (crypto/_bin_products.c): for type checkers, which cannot read C.
from collections.abc import Sequence

import numpy as np
from gmpy2 import mpz

def bin_products(ciphertexts: list[mpz], rows: np.ndarray, codes: np.ndarray, n_bins: int,
                 modulus: mpz) -> bytes: ...
def window_powers(rows: list[Sequence[mpz]], exponents: bytes, width: int,
                  window_bits: int, modulus: mpz) -> bytes: ...
