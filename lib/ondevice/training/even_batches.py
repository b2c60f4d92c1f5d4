"""Even batches: an epoch of n examples in ceil(n / batch_size) batches whose sizes differ by at
most one, in place of full batches and a short remainder; every example still trains every epoch.

Why: a network whose batch normalisation runs on batch statistics (AutLearn's MobileNet baselines,
`papers/autlearn/cloud_baselines.every_layer`) normalises a short last batch by the statistics of
a few images and moves its moving statistics toward them, and a FedAvg client (a FEMNIST writer,
about 140 images at batch 32) has such a batch in every local epoch. Measured at smoke scale
(2026-12-05; 8 writers, IID FedAvg of 2 clients a round, 2 local epochs, SGD 0.03, 32 px): with
the remainder batches the loss on the validation writers rose from 4.65 to 5-6 and kept 3.17;
with the remainders dropped it fell to 1.50, in even batches to 1.83 (a noisier curve, kept by the
same patience of 3 evaluations), each example still seen every epoch.
"""

from __future__ import annotations

import numpy as np

from ondevice.training.step import Hook


class EvenBatches(Hook):
    """Batches of (inputs, labels) arrays, sizes as equal as the count allows, in a random order."""

    name = "even batches"

    def batches(self, task, data, batch_size: int, rng):
        x, y = data
        order = rng.permutation(len(x)) if rng is not None else np.arange(len(x))
        return [(x[idx], y[idx]) for idx in np.array_split(order, max(1, -(-len(x) // batch_size)))]
