"""Cloud update (Colla Sec. 3.3, Eq. 4): the cloud model is distilled on the cloud's own data from
the average of the client models' outputs. Client models know only their own places, so each
one's probabilities are padded with zeros to every place before averaging.

The cloud never sees device data: it holds the uploaded client parameters and runs them on its
own data. All client models have the same shape (customised FC = switchable slots), so they run
at once, stacked (`models.mrnn.stacked_probabilities`); `members` weights which of them teach (a
group, or all for the base cloud model).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ondevice.models import mrnn


def placement(slot_places: np.ndarray, places: int) -> np.ndarray:
    """[clients, slots, places] one-hot map of each switched-on slot to its place (zero rows when off)."""
    onehot = np.zeros((*slot_places.shape, places), np.float32)
    m, s = np.nonzero(slot_places >= 0)
    onehot[m, s, slot_places[m, s]] = 1.0
    return onehot


class ClientEnsemble(tf.Module):
    """The mean of the member clients' softmax outputs, zero-padded to every place."""

    def __init__(self, client_weights_template: list[np.ndarray], max_clients: int, slots: int, places: int):
        super().__init__(name="client_ensemble")
        self.weights = [
            tf.Variable(tf.zeros([max_clients, *w.shape]), trainable=False) for w in client_weights_template
        ]
        self.placement = tf.Variable(tf.zeros([max_clients, slots, places]), trainable=False)
        self.members = tf.Variable(tf.zeros([max_clients]), trainable=False)
        self.max_clients = max_clients

    def assign(self, client_weights: list[list[np.ndarray]], slot_places: np.ndarray) -> None:
        """The uploaded client models (weights and slot maps); every client a member until `use`."""
        n = len(client_weights)
        if n > self.max_clients:
            raise ValueError(f"{n} clients, but the ensemble was built for at most {self.max_clients}")
        for var, stacked in zip(self.weights, mrnn.stack(client_weights)):
            full = np.zeros(var.shape, np.float32)
            full[:n] = stacked
            var.assign(full)
        full = np.zeros(self.placement.shape, np.float32)
        full[:n] = placement(slot_places, self.placement.shape[-1])
        self.placement.assign(full)
        self.use(np.arange(n))

    def use(self, members: np.ndarray) -> None:
        mask = np.zeros(self.max_clients, np.float32)
        mask[np.asarray(members, int)] = 1.0
        self.members.assign(mask)

    def padded(self, inputs):
        """[clients, batch, places]: every client's probabilities, zero outside its places."""
        return tf.einsum("mbs,msv->mbv", mrnn.stacked_probabilities(self.weights, inputs), self.placement)

    def __call__(self, inputs):
        weights = self.members / tf.reduce_sum(self.members)
        return tf.einsum("m,mbv->bv", weights, self.padded(inputs))
