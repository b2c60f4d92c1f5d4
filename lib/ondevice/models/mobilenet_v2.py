"""MobileNetV2 (Sandler et al., 2018) for MoIL's image experiments: the Keras application
architecture (`weights=None`: the suite pre-trains it, or loads ImageNet weights at paper scale
through a manifest), with width `alpha` and a square input size from the scale preset, and
logits over the union of global and local classes.

Input: images in [0, 1] of shape (size, size, channels). Greyscale (1 channel: Fashion-MNIST,
digits) is repeated to the 3 channels the architecture expects inside the model; both are then
scaled to [-1, 1] as MobileNetV2 was trained. Resizing to `size` happens once in the data
pipeline (`experiments.moil_image`), not per step.

"Layers" for LF(n): the rows of MobileNetV2's architecture table (its paper's Table 2) that
hold weights, in order: the stem convolution, the 17 inverted-residual bottleneck blocks, the
final 1x1 convolution (with the global average pooling after it) and the classifier: 20 units.
LF(1) trains the classifier alone and its cached feature map is the pooled 1,280-vector, which
is the thesis's footnote 5 (1,280 float32 = 5,120 bytes per image): that fixes where its last
layer starts. Each bottleneck is one unit because its residual connection cannot be cut.
"""

from __future__ import annotations

import re

import numpy as np
import tf_keras as keras


def build(
    size: int, channels: int, classes: int, alpha: float, bn_momentum: float = 0.999, name: str = "mobilenet_v2"
) -> keras.Model:
    """MobileNetV2 of width `alpha` on (size, size, channels) inputs in [0, 1], `classes` logits.
    `bn_momentum`: Keras's MobileNetV2 uses 0.999 (for ImageNet's ~10^6 steps); a short training
    needs a smaller one, or the moving statistics used at inference (and by frozen units) stay
    near their initial values."""
    if channels not in (1, 3):
        raise ValueError(f"MobileNetV2 takes 1 (greyscale) or 3 (RGB) channels, got {channels}")
    if size < 32:
        raise ValueError(f"MobileNetV2 needs an input size of at least 32 pixels, got {size}")
    inputs = keras.Input((size, size, channels), name="image")
    x = keras.layers.Concatenate(name="to_rgb")([inputs] * 3) if channels == 1 else inputs
    x = keras.layers.Rescaling(2.0, offset=-1.0, name="to_unit_range")(x)
    net = keras.applications.MobileNetV2(
        input_tensor=x, alpha=alpha, weights=None, classes=classes, classifier_activation=None
    )
    for layer in net.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = bn_momentum
    return keras.Model(inputs, net.output, name=name)


def _unit(layer) -> str | None:
    name = layer.name
    if name in ("Conv1", "bn_Conv1", "Conv1_relu"):
        return "stem"
    if name.startswith("expanded_conv_"):
        return "block_0"
    match = re.match(r"block_(\d+)_", name)
    if match:
        return f"block_{match.group(1)}"
    if name in ("Conv_1", "Conv_1_bn", "out_relu") or isinstance(layer, keras.layers.GlobalAveragePooling2D):
        return "top"
    if name == "predictions":
        return "classifier"
    return None  # input and the weight-free input conversion, never trained


def units(model: keras.Model) -> list[list]:
    """The 20 units of MobileNetV2 (stem, block_0..block_16, top, classifier), each a list of
    its Keras layers in order."""
    grouped: dict[str, list] = {}
    for layer in model.layers:
        key = _unit(layer)
        if key is not None:
            grouped.setdefault(key, []).append(layer)
    if len(grouped) != 20:
        raise ValueError(f"{model.name} is not a Keras MobileNetV2: found units {list(grouped)}")
    return list(grouped.values())


def load_imagenet(model: keras.Model, path, classes: int) -> keras.Model:
    """Keras's ImageNet weights of MobileNetV2 (`mobilenet_v2_weights_tf_dim_ordering_tf_kernels_
    <width>_<size>.h5`, data_manifests/mobilenet_v2_imagenet.yaml) into `model`, layer by layer in
    the order Keras itself loads them (the weighted layers in graph order). The file's classifier
    (1,280 x `classes`, ImageNet's 1,000 in Keras's order: sorted WordNet ids) fills the model's
    first `classes` outputs; the outputs after them (the local classes) keep their fresh
    initialisation."""
    import h5py

    expected = (
        "the Keras MobileNetV2 weights file as keras.applications writes it (HDF5, attribute layer_names, "
        "one group per layer with weight_names: Conv1, bn_Conv1, expanded_conv_depthwise, ..., Conv_1, "
        "Conv_1_bn, then the classifier)"
    )
    ours = [layer for layer in model.layers if layer.weights]
    try:
        with h5py.File(path, "r") as f:
            group = f["model_weights"] if "model_weights" in f else f
            names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["layer_names"]]
            saved = []
            for name in names:
                weight_names = [w.decode() if isinstance(w, bytes) else w for w in group[name].attrs["weight_names"]]
                if weight_names:
                    saved.append((name, [np.asarray(group[name][w]) for w in weight_names]))
    except (OSError, KeyError) as exc:
        raise ValueError(f"{path}: not readable as {expected} ({exc})") from exc
    if len(saved) != len(ours):
        raise ValueError(
            f"{path}: {len(saved)} weighted layers, {model.name} has {len(ours)}; expected {expected} of the same width"
        )
    for (name, values), layer in zip(saved, ours):
        shapes = [tuple(w.shape) for w in layer.weights]
        if layer is ours[-1]:  # the classifier: ImageNet's classes first
            (kernel, bias), k_shape = values, shapes[0]
            if kernel.shape[0] != k_shape[0] or kernel.shape[1] != classes or classes > k_shape[1]:
                raise ValueError(
                    f"{path}: classifier {name!r} is {kernel.shape}; expected {k_shape[0]} x {classes} "
                    f"(the global classes, e.g. all 1,000 ImageNet wnid folders) of {model.name}'s {k_shape}"
                )
            k, b = (w.numpy() for w in layer.weights)
            k[:, : kernel.shape[1]], b[: bias.shape[0]] = kernel, bias
            values = [k, b]
        elif [tuple(v.shape) for v in values] != shapes:
            raise ValueError(
                f"{path}: layer {name!r} holds {[v.shape for v in values]}, {model.name}'s layer "
                f"{layer.name!r} needs {shapes}; expected {expected} of the same width"
            )
        layer.set_weights(values)
    return model
