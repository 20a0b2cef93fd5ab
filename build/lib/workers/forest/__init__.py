"""The vertical random forest (seed 002): the active party's and a passive party's steps."""
