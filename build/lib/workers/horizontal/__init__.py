"""The horizontal protocol (FedTree): members with different rows and the same columns, an
aggregator that sums masked histograms."""
