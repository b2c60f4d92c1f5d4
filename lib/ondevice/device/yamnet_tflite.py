"""The weights of the published `yamnet.tflite` into `models.yamnet`'s Keras model: batch norm is
folded into the convolutions there, and most kernels are stored as int8 with one scale per tensor.
Reading them takes a TFLite interpreter, hence this module sits in `device/`, not in `models/`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ondevice.device.litert import interpreter
from ondevice.models.yamnet import BN_EPSILON


def _tflite_tensor(interp: tf.lite.Interpreter, index: int) -> np.ndarray:
    """A constant tensor as float32; int8 ones dequantised (int8 * scale, one scale per tensor or
    per channel along the quantised dimension; YAMNet's zero points are 0)."""
    detail = interp._get_tensor_details(index, 0)  # noqa: SLF001 - the public list lacks per-tensor lookup
    value = interp.get_tensor(index)
    if value.dtype != np.float32:
        q = detail["quantization_parameters"]
        if not len(q["scales"]) or np.any(q["zero_points"] != 0):
            raise ValueError(f"tensor {detail['name']}: expected int8 scales with zero point 0, got {q}")
        shape = [1] * value.ndim
        shape[q["quantized_dimension"]] = -1
        value = value.astype(np.float32) * np.reshape(q["scales"], shape if len(q["scales"]) > 1 else [1] * value.ndim)
    return value.astype(np.float32)


def read_tflite_weights(path: str | Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(op, kernel, bias) of the conv, depthwise and fully connected ops of `yamnet.tflite`, in
    graph order, kernels dequantised. Ops are matched by order, not by the converter's names."""
    interp = interpreter(Path(path).read_bytes())
    ops = []
    for op in interp._get_ops_details():  # noqa: SLF001 - no public API lists a graph's ops
        kind = op["op_name"]
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D") or (kind == "FULLY_CONNECTED" and op["inputs"][2] >= 0):
            ops.append([kind, *op["inputs"][1:3]])
    # a dequantised kernel is the output of a DEQUANTIZE op: follow it back to its int8 source
    dequantize = {
        op["outputs"][0]: op["inputs"][0]
        for op in interp._get_ops_details()  # noqa: SLF001
        if op["op_name"] == "DEQUANTIZE"
    }
    # the front end's mel matrix is also a fully connected op with a bias (the log offset); the
    # network's ops are the 27 convolutions and the classifier after it
    network = [o for o in ops if o[0] != "FULLY_CONNECTED"] + [o for o in ops if o[0] == "FULLY_CONNECTED"][-1:]
    return [(kind, _tflite_tensor(interp, dequantize.get(k, k)), _tflite_tensor(interp, b)) for kind, k, b in network]


def import_tflite(model: keras.Model, path: str | Path) -> keras.Model:
    """Set `model`'s weights from the published TFLite file: each folded conv kernel becomes the
    conv kernel and its bias the batch norm's beta, with mean 0 and variance 1 - epsilon, so the
    batch norm is the identity plus that bias. Returns the model."""
    ops = read_tflite_weights(path)
    convs = [layer for layer in model.layers if isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D))]
    bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    dense = model.get_layer("classifier_logits")
    if len(ops) != len(convs) + 1 or len(bns) != len(convs):
        raise ValueError(f"{path}: {len(ops)} weighted ops, the model has {len(convs)} convolutions + 1 dense")
    for (kind, kernel, bias), conv, bn in zip(ops, convs, bns):
        depthwise = isinstance(conv, keras.layers.DepthwiseConv2D)
        if depthwise != (kind == "DEPTHWISE_CONV_2D"):
            raise ValueError(f"{path}: op {kind} does not match layer {conv.name}")
        conv.set_weights([np.transpose(kernel, (1, 2, 3, 0))])  # [out|1, h, w, in] -> [h, w, in, out|1]
        bn.set_weights([bias, np.zeros_like(bias), np.full_like(bias, 1 - BN_EPSILON)])
    kind, kernel, bias = ops[-1]
    if kernel.shape != (dense.units, dense.kernel.shape[0]):
        raise ValueError(f"{path}: classifier is {kernel.shape}, the model's is {tuple(dense.kernel.shape)[::-1]}")
    dense.set_weights([kernel.T, bias])
    return model
