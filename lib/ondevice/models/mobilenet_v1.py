"""MobileNet v1 (Howard et al., 2017) with Keras's ImageNet weights, for AutLearn's image
experiments: the public pre-trained model with a new 62-class head for LEAF FEMNIST.

How a 28x28 grey FEMNIST image enters it (all inside the model, so every caller and the TFLite
export see the same thing): bilinear resize to `size` x `size` (the smallest input on which the
ImageNet filters still see strokes of a few pixels; 224 is ImageNet's size), the grey channel
repeated to the 3 RGB channels the first convolution expects, and [0, 1] scaled to [-1, 1], the
range MobileNet was trained on (Keras's `preprocess_input`). FEMNIST's white background and dark
ink are kept as they are (an ImageNet photo has no polarity convention).

The model's backbone (every convolution up to the global average pooling) runs in inference mode:
its BatchNormalization layers use their moving statistics and never update them, so training the
head alone (AutLearn) changes nothing below it. AutLearn's cloud baselines, which train every layer
(CloudTrain, FedAvg), go through `adapting`, the same layers with batch normalisation in training
mode (batch statistics in the step, moving statistics updated toward FEMNIST's). With ImageNet's
statistics fixed, FEMNIST's activations are badly scaled and plain SGD cannot train the
network (default, 6,000 pooled training images, 3 epochs, loss on the 873 validation images:
SGD 0.01 sits at the class prior, 3.45 -> 3.44; adapting, SGD 0.01 falls to 1.13; Adam 5e-4 on all
13,858 images, 4 epochs: 1.09 fixed, 0.75 adapting; 2026-12-05). The head is one dense layer named
`logits` (AutLearn's "last FC + softmax"; the softmax lives in the task's loss).
"""

from __future__ import annotations

from pathlib import Path

import tf_keras as keras

HEAD = "logits"
BACKBONE = "mobilenet_backbone"
BN_MOMENTUM = 0.9  # `adapting`'s


def build(
    weights: str | Path | None, alpha: float, size: int, classes: int, *, side: int = 28, seed: int | None = None
) -> keras.Model:
    """(side, side, 1) images in [0, 1] -> `classes` logits. `weights`: a Keras no-top .h5 of
    MobileNet at this `alpha` (e.g. data_manifests/mobilenet_v1_imagenet.yaml), or None for random
    weights. `seed` fixes the head's initial weights."""
    if size < 32:
        raise ValueError(f"MobileNet needs an input size of at least 32 pixels, got {size}")
    images = keras.Input((side, side, 1), name="image")
    x = keras.layers.Resizing(size, size, interpolation="bilinear", name="resize")(images)
    x = keras.layers.Concatenate(name="grey_to_rgb")([x, x, x])
    x = keras.layers.Rescaling(2.0, offset=-1.0, name="to_unit_range")(x)
    backbone = keras.applications.MobileNet(
        input_shape=(size, size, 3),
        alpha=alpha,
        include_top=False,
        weights=str(weights) if weights else None,
        pooling="avg",
    )
    backbone._name = BACKBONE
    features = backbone(x, training=False)
    init = keras.initializers.GlorotUniform(seed=seed)
    logits = keras.layers.Dense(classes, name=HEAD, kernel_initializer=init)(features)
    return keras.Model(images, logits, name="mobilenet_v1")


def feature_model(model: keras.Model) -> keras.Model:
    """The model up to the head's input (the pooled features), sharing its layers."""
    return keras.Model(model.input, model.get_layer(HEAD).input, name="mobilenet_v1_features")


def head_model(model: keras.Model) -> keras.Model:
    """The head alone on cached features, sharing its layer: training it trains `model`'s head."""
    head = model.get_layer(HEAD)
    features = keras.Input((head.input.shape[-1],), name="features")
    return keras.Model(features, head(features), name="mobilenet_v1_head")


def adapting(model: keras.Model) -> keras.Model:
    """`model`'s layers (shared: training it trains `model`) with the backbone's batch normalisation
    following the training flag, for trainings of every layer (see the module's docstring). Its
    moving statistics follow about the last ten steps (momentum 0.9, PyTorch's default, against
    Keras's 0.99): a FedAvg client takes about 13 steps a round, too few for 0.99 to carry the
    statistics of the weights it trains to the averaged model. It sets the shared layers' momentum,
    which only a call in training mode reads."""
    for layer in model.get_layer(BACKBONE).layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BN_MOMENTUM
    images = keras.Input(model.input.shape[1:], name="image")
    x = model.get_layer("resize")(images)
    x = model.get_layer("grey_to_rgb")([x, x, x])
    x = model.get_layer("to_unit_range")(x)
    logits = model.get_layer(HEAD)(model.get_layer(BACKBONE)(x))
    return keras.Model(images, logits, name="mobilenet_v1_adapting")
