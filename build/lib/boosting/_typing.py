"""Array aliases used across the boosting core."""

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BinMatrix = npt.NDArray[np.uint8]
"""Rows x features bin indices; the missing-value bin is ``max_bin``."""
Histogram = npt.NDArray[np.int64]
"""Nodes x features x (max_bin + 1) x 3: exact sums of quantized g, h and the row count."""
