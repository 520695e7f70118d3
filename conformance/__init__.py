"""cbbench's conformance suite (a package so that tests import shared helpers as `conformance.*`)."""

import torch

# The suite runs many tiny forwards; on a small shared machine intra-op threads only fight each other and the other
# processes for the cores, and an engine run slows down many times over (docs/measurements.md, "The test suite").
torch.set_num_threads(1)
