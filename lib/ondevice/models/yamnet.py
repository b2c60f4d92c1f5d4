"""YAMNet (Plakal & Ellis, 2020): a MobileNetV1-style audio tagger on 0.96 s log-mel patches.

Input: patches of 96 frames x 64 mel bins (`data.audio_features`); output: logits over the 521
AudioSet classes (the task's sigmoid turns them into scores). Fourteen convolutional layers, a
3x3 convolution then thirteen depthwise-separable ones, each followed by batch norm (centre, no
scale, epsilon 1e-4) and ReLU, then global average pooling and a dense layer.

Batch norm uses its moving statistics, also while training (unless built for pre-training): personalisation runs with
small batches from a pre-trained model, and a frozen part must be a fixed function of its input
for feature-map caching (MoIL Sec. 4.3) to give the same result as running it.

`units(model)` is what MoIL counts as YAMNet's layers: the thesis's audio cache holds 960 KB per
10 s clip (Sec. 5.2, footnote 6) with LF(3), which is 20 patches x 6 x 4 x 512 float32, the
output of YAMNet's layer 12. So LF(3) trains layers 13 and 14 and the classifier: a "layer" is
one of YAMNet's 14 named conv layers (a separable one counts once) or the classifier, 15 in all.

`load_h5` reads the published float32 `yamnet.h5` by the official code's layer names;
`device.yamnet_tflite.import_tflite` reads the published `yamnet.tflite` into this model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tf_keras as keras

PATCH_FRAMES, MEL_BINS, CLASSES = 96, 64, 521
BN_EPSILON = 1e-4
# (kind, stride, filters) of YAMNet's layers 1..14
LAYERS = (
    ("conv", 2, 32),
    ("sep", 1, 64),
    ("sep", 2, 128),
    ("sep", 1, 128),
    ("sep", 2, 256),
    ("sep", 1, 256),
    ("sep", 2, 512),
    ("sep", 1, 512),
    ("sep", 1, 512),
    ("sep", 1, 512),
    ("sep", 1, 512),
    ("sep", 1, 512),
    ("sep", 2, 1024),
    ("sep", 1, 1024),
)


def build(
    classes: int = CLASSES, *, seed: int | None = None, name: str = "yamnet", train_batchnorm: bool = False
) -> keras.Model:
    """Patches [batch, 96, 64] -> logits [batch, classes]; weights random (seeded) until imported.
    `train_batchnorm` (pre-training from scratch only): batch norm normalises by batch statistics
    while training and updates its moving ones; the weights then load into the default model."""

    def init(i):
        return keras.initializers.GlorotUniform(seed=None if seed is None else seed * 64 + i)

    def bn_relu(x, prefix):
        # momentum 0.9 when training them: short pre-training runs (the stand-in's) end with
        # moving statistics that match the batches'; it plays no part when they are frozen
        x = keras.layers.BatchNormalization(
            center=True, scale=False, epsilon=BN_EPSILON, momentum=0.9, name=f"{prefix}_bn"
        )(x, training=None if train_batchnorm else False)
        return keras.layers.ReLU(name=f"{prefix}_relu")(x)

    patches = keras.Input(shape=(PATCH_FRAMES, MEL_BINS), name="patches")
    x = keras.layers.Reshape((PATCH_FRAMES, MEL_BINS, 1), name="layer1_reshape")(patches)
    for i, (kind, stride, filters) in enumerate(LAYERS, 1):
        if kind == "conv":
            x = keras.layers.Conv2D(
                filters, 3, stride, padding="same", use_bias=False, kernel_initializer=init(i), name=f"layer{i}_conv"
            )(x)
            x = bn_relu(x, f"layer{i}_conv")
        else:
            x = keras.layers.DepthwiseConv2D(
                3,
                stride,
                padding="same",
                use_bias=False,
                depthwise_initializer=init(100 + i),
                name=f"layer{i}_depthwise",
            )(x)
            x = bn_relu(x, f"layer{i}_depthwise")
            x = keras.layers.Conv2D(
                filters, 1, padding="same", use_bias=False, kernel_initializer=init(i), name=f"layer{i}_pointwise"
            )(x)
            x = bn_relu(x, f"layer{i}_pointwise")
    x = keras.layers.GlobalAveragePooling2D(name="classifier_pool")(x)
    logits = keras.layers.Dense(classes, kernel_initializer=init(0), name="classifier_logits")(x)
    return keras.Model(patches, logits, name=name)


def units(model: keras.Model) -> list[list[keras.layers.Layer]]:
    """MoIL's layers of YAMNet, input to output: layer1 .. layer14, then the classifier (15)."""
    groups: dict[str, list] = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        groups.setdefault(layer.name.split("_", 1)[0], []).append(layer)
    order = [f"layer{i}" for i in range(1, len(LAYERS) + 1)] + ["classifier"]
    if list(groups) != order:
        raise ValueError(f"{model.name} is not a YAMNet built by ondevice.models.yamnet.build: units {list(groups)}")
    return [groups[k] for k in order]


def class_names(class_map: str | Path) -> list[str]:
    """Display names of the 521 classes, in output order, from `yamnet_class_map.csv`."""
    import csv

    with open(class_map, newline="") as f:
        rows = list(csv.DictReader(f))
    if (
        not rows
        or set(rows[0]) != {"index", "mid", "display_name"}
        or [int(r["index"]) for r in rows] != list(range(len(rows)))
    ):
        raise ValueError(f"{class_map}: expected columns index,mid,display_name with index 0..n-1")
    return [r["display_name"] for r in rows]


H5_LAYOUT = (
    "the published yamnet.h5 (Keras HDF5 weights, attribute layer_names, one group per layer with "
    "weight_names) of the tensorflow/models YAMNet code: layers layer1/conv, layer1/conv/bn, then per "
    "layer i = 2..14 layer<i>/depthwise_conv, layer<i>/depthwise_conv/bn, layer<i>/pointwise_conv, "
    "layer<i>/pointwise_conv/bn, and one unnamed logits Dense layer (1024 x 521 kernel, bias)"
)


def official_name(name: str) -> str:
    """Our layer name -> the tensorflow/models YAMNet code's (layer3_depthwise_bn ->
    layer3/depthwise_conv/bn)."""
    import re

    match = re.fullmatch(r"(layer\d+)_(conv|depthwise|pointwise)(_bn)?", name)
    if not match:
        raise ValueError(f"{name!r} is not a conv or batch norm layer of this YAMNet")
    kind = {"conv": "conv", "depthwise": "depthwise_conv", "pointwise": "pointwise_conv"}[match[2]]
    return f"{match[1]}/{kind}" + ("/bn" if match[3] else "")


def load_h5(model: keras.Model, path: str | Path) -> keras.Model:
    """The published `yamnet.h5` (float32 Keras weights, `H5_LAYOUT`) into `model`: each conv and
    batch norm layer from the file's layer of the official name, the classifier from the one
    weighted layer left (the official code does not name it). Any other layout is an error that
    names the file and what it lacks. Returns the model."""
    import h5py

    saved = {}
    try:
        with h5py.File(path, "r") as f:
            group = f["model_weights"] if "model_weights" in f else f
            for name in group.attrs["layer_names"]:
                name = name.decode() if isinstance(name, bytes) else name
                weights = [w.decode() if isinstance(w, bytes) else w for w in group[name].attrs["weight_names"]]
                if weights:
                    saved[name] = [np.asarray(group[name][w]) for w in weights]
    except (OSError, KeyError) as exc:
        raise ValueError(f"{path}: not readable as {H5_LAYOUT} ({exc})") from exc

    def put(layer, name, values):
        shapes = [tuple(w.shape) for w in layer.weights]
        if [v.shape for v in values] != shapes:
            raise ValueError(
                f"{path}: layer {name!r} holds {[v.shape for v in values]}, {layer.name} needs {shapes}; "
                f"expected {H5_LAYOUT}"
            )
        layer.set_weights(values)

    dense = model.get_layer("classifier_logits")
    for layer in model.layers:
        if layer.weights and layer is not dense:
            name = official_name(layer.name)
            if name not in saved:
                raise ValueError(
                    f"{path}: no weighted layer {name!r} (found {len(saved)}: {sorted(saved)[:4]} ...); "
                    f"expected {H5_LAYOUT}"
                )
            put(layer, name, saved.pop(name))
    if len(saved) != 1:
        raise ValueError(
            f"{path}: after the conv layers, {len(saved)} weighted layers are left ({sorted(saved)}), "
            f"expected only the logits layer; expected {H5_LAYOUT}"
        )
    ((name, values),) = saved.items()
    put(dense, name, values)
    return model
