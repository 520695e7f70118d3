"""cbbench's conformance suite (a package so that tests import shared helpers as `conformance.*`)."""

import torch

# The suite runs many tiny forwards; on a small shared machine intra-op threads only fight each other
# (measured here: one engine run took 5 s with 1 thread and 47 s with 2 under load).
torch.set_num_threads(1)
