"""Tolerances for comparing two float32 computations of the same math, derived from what is summed.

Why: two code paths (TensorFlow vs the LiteRT interpreter, cached features vs the whole model, a hook
vs a separate model, another thread count or CPU) sum the same float32 terms in another order, so
their results differ by rounding, and by how much depends on the machine: a bare atol=1e-6 tuned on
one CPU failed on another by 4.1e-6. A sum of n float32 terms computed in any order is within
(n - 1) * eps/2 * sum|x_i| of the exact sum (eps = 2**-23 = 1.19e-7), so two orders differ by at most
n * eps * sum|x_i|; rounding errors of random sign usually grow like sqrt(n), so the bound has a
safety factor of about sqrt(n) over what is typically seen. Chained layers add their relative errors.

Such a tolerance still fails on a real bug: a wrong sign, a missing term or another learning rate
moves a value by a sizeable fraction of its magnitude, orders of magnitude above n * eps of it.
"""

import numpy as np

EPS = float(np.finfo(np.float32).eps)


def float32_sum_tolerance(terms: int, magnitude: float, layers: int = 1) -> float:
    """How far two float32 evaluations of `layers` chained sums of `terms` terms each may differ when
    the terms' absolute values add up to `magnitude` (or, for terms of random sign, when the values
    compared are up to `magnitude`: then the bound's sqrt(n) slack covers sum|x_i| ~ sqrt(n) |sum|)."""
    return layers * terms * EPS * float(magnitude)


def lstm_terms(length: int, inputs: int, units: int, layers: int = 2) -> int:
    """Summed float32 terms along a stack of LSTM layers' longest chain: each step's gate pre-activations
    sum max(inputs, units) + units + 1 terms (input, recurrent, bias), over `length` steps of `layers`."""
    return layers * length * (max(inputs, units) + units + 1)


def float32_deep_tolerance(terms: int, magnitude: float, safety: float = 10.0) -> float:
    """For a deep network, where the worst-case bound over thousands of chained terms would be too loose
    to catch a bug: the typical error of rounding steps of random sign, sqrt(terms) * eps * magnitude
    (`terms` counted over all layers), times `safety`."""
    return safety * float(np.sqrt(terms)) * EPS * float(magnitude)


def update_tolerance(desired, start, terms: int) -> float:
    """How far two float32 trainings' moves from `start` may differ: the typical rounding of the
    chained sums (`float32_deep_tolerance`: the worst case over thousands of steps' terms would not
    catch a wrong learning rate), on the largest move, plus 4 ulp of the largest weight."""
    move = float(np.abs(np.asarray(desired) - start).max(initial=0.0))
    return float32_deep_tolerance(terms, move) + 4 * EPS * float(np.abs(start).max(initial=0.0))


def assert_close_float32(
    actual, desired, terms: int, layers: int = 1, magnitude: float | None = None, deep: bool = False, err_msg=""
):
    """assert_allclose with atol = float32_sum_tolerance(terms, magnitude, layers) (with `deep`,
    float32_deep_tolerance(layers * terms, magnitude)), magnitude defaulting to the largest absolute
    value of `desired`."""
    desired = np.asarray(desired)
    if magnitude is None:
        magnitude = float(np.abs(desired).max(initial=0.0))
    if deep:
        atol = float32_deep_tolerance(layers * terms, magnitude)
    else:
        atol = float32_sum_tolerance(terms, magnitude, layers)
    np.testing.assert_allclose(actual, desired, rtol=0, atol=atol, err_msg=err_msg)


def assert_same_update(actual, desired, start, terms: int, layers: int = 1, err_msg=""):
    """Weights trained from `start` along two paths: their moves from `start` agree to
    float32_sum_tolerance(terms, the largest move, layers) (the gradient's sums; SGD scales them by lr),
    plus 4 ulp of the largest weight for the rounding of w - lr * g and of the subtraction here."""
    start = np.asarray(start)
    move, other = np.asarray(actual) - start, np.asarray(desired) - start
    atol = float32_sum_tolerance(terms, np.abs(other).max(initial=0.0), layers)
    atol += 4 * EPS * float(np.abs(start).max(initial=0.0))
    np.testing.assert_allclose(move, other, rtol=0, atol=atol, err_msg=err_msg)


def keras_terms(model) -> int:
    """Summed float32 terms along a Keras model's chain of layers (for a deep network, to pass to
    float32_deep_tolerance): each convolution's or dense layer's fan-in (kernel area x input channels,
    a depthwise one's kernel area) plus its bias, and each global average pooling's area."""
    import tf_keras as keras

    terms = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            terms += int(np.prod(layer.kernel_size)) + int(layer.use_bias)
        elif isinstance(layer, keras.layers.Conv2D):
            terms += int(np.prod(layer.kernel_size)) * int(layer.input_shape[-1]) + int(layer.use_bias)
        elif isinstance(layer, keras.layers.Dense):
            terms += int(layer.input_shape[-1]) + int(layer.use_bias)
        elif isinstance(layer, keras.layers.GlobalAveragePooling2D):
            terms += int(np.prod(layer.input_shape[1:3]))
    return terms
