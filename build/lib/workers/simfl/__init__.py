"""SimFL (seed 000): similarity-based horizontal boosting; members exchange LSH values once and
weighted gradients per tree."""
