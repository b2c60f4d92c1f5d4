"""Training only some layers: the one freezing hook behind DeepType's fine-tune training (Sec. 5:
only the softmax trains, the embedding and LSTM layers stay a fixed feature extractor, so no
gradient flows below the softmax), AutLearn's last layer, Colla's FC-only update, MoIL's layer
freezing LF(n) (`papers/moil/techniques/layer_freezing.py` chooses its layers) and the TensorFlow
side of the builtin export's head training (`device.parity`).

Which layers train: a layer's name, a list of names, or a function of the model that returns
the layers (and may mark the others non-trainable itself, as MoIL's does). With `freeze`, every
other layer is also marked non-trainable, so that its batch norm runs on its moving statistics
during training; that changes the model, so give it a copy.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tf_keras as keras

from ondevice.training.step import Hook

Layers = Callable[[keras.Model], list]


class FineTune(Hook):
    """Train only the variables of the chosen layers (default: the LSTM LM's output layer, `softmax`)."""

    def __init__(self, layers: str | Sequence[str] | Layers = "softmax", freeze: bool = False):
        self.layers, self.freeze = layers, freeze

    def chosen(self, model: keras.Model) -> list:
        if callable(self.layers):
            return self.layers(model)
        names = [self.layers] if isinstance(self.layers, str) else list(self.layers)
        return [model.get_layer(name) for name in names]

    def trainable(self, model, variables: list) -> list:
        train = self.chosen(model)
        if self.freeze:
            for layer in model.layers:
                if all(layer is not t for t in train):
                    layer.trainable = False
        keep = {id(v) for layer in train for v in layer.trainable_variables}
        return [v for v in variables if id(v) in keep]
