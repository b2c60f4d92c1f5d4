"""Next-word prediction while typing (DeepType Sec. 2-3): samples, masked loss, top-k-eff."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..data.typing_samples import PAD_ID, UNK_ID, Samples, batch_indices
from ..metrics import chars_needed, top_k_eff
from . import Signature, Task, inference


def cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-position cross-entropy as logsumexp minus the label's logit. TensorFlow's
    `sparse_softmax_cross_entropy_with_logits` computes the same (to float32 rounding) but also
    writes a vocabulary-wide gradient tensor even when none is needed; this form took a third of its
    time in evaluation and made the training step 17% faster at batch 128 (`make bench`)."""
    labels = tf.convert_to_tensor(labels)
    return tf.reduce_logsumexp(logits, axis=-1) - tf.gather(logits, labels, batch_dims=labels.shape.rank)


def masked_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Sum of per-position cross-entropy over real positions (label != <pad>) and their count."""
    mask = tf.cast(tf.not_equal(labels, PAD_ID), logits.dtype)
    return tf.reduce_sum(cross_entropy(labels, logits) * mask), tf.reduce_sum(mask)


@tf.function(reduce_retracing=True)
def position_scores(logits, labels, k):
    """Per position: is the label among the top-k suggestions, and its cross-entropy.

    <pad> and <unk> are never suggested (a keyboard shows words), so an out-of-vocabulary
    word is never a hit: its characters all have to be typed.
    """
    excluded = tf.one_hot([PAD_ID, UNK_ID], tf.shape(logits)[-1], on_value=True, off_value=False)
    excluded = tf.reduce_any(excluded, axis=0)
    shown = tf.where(excluded, tf.constant(-np.inf, logits.dtype), logits)
    label_logit = tf.gather(logits, labels, batch_dims=2)
    # words scoring at least as high as the label, the label itself excluded: ties count against it
    rank = tf.reduce_sum(tf.cast(shown >= label_logit[..., None], tf.int32), axis=-1) - 1
    hit = (rank < k) & tf.not_equal(labels, UNK_ID)
    return hit, cross_entropy(labels, logits)


class NextWordTask(Task):
    """Samples are DeepType's (previous words, then typed characters); labels are word ids."""

    name = "next_word"
    signature = Signature(
        tf.TensorSpec([None, None], tf.int32, name="tokens"), tf.TensorSpec([None, None], tf.int32, name="labels")
    )

    LOSSES = ("position", "sample")

    def __init__(self, k: int = 3, eval_batch_size: int = 256, loss_per: str = "position"):
        """`loss_per`: "position" averages the cross-entropy over the labelled positions of a batch;
        "sample" sums it over a sample's positions and averages over samples, as TensorFlow's PTB
        model (which DeepType follows) does, so that its learning rate means the same step size."""
        if loss_per not in self.LOSSES:
            raise ValueError(f"loss_per must be one of {self.LOSSES}, got {loss_per!r}")
        self.k, self.eval_batch_size, self.loss_per = k, eval_batch_size, loss_per

    def batches(self, data: Samples, batch_size: int, rng: np.random.Generator | None):
        for idx in batch_indices(data, batch_size, rng):
            yield data.padded(idx)

    def loss(self, labels, outputs):
        total, count = masked_cross_entropy(labels, outputs)
        if self.loss_per == "sample":
            return total / tf.cast(tf.shape(labels)[0], total.dtype)
        return total / count

    def evaluate(self, model, data: Samples) -> dict:
        """top-k-eff and perplexity over every labelled position, plus R(x) per sample."""
        if len(data) == 0:
            raise ValueError("cannot evaluate on an empty sample set")
        needed, forward = np.zeros(len(data), np.int32), inference(model)
        ce_sum, count = 0.0, 0
        for start in range(0, len(data), self.eval_batch_size):
            idx = np.arange(start, min(start + self.eval_batch_size, len(data)))
            x, y = data.padded(idx)
            hit, ce = position_scores(forward(x), tf.constant(y), tf.constant(self.k))
            hit, ce = hit.numpy(), ce.numpy()
            ce_sum += float(ce[y != PAD_ID].sum())
            count += int((y != PAD_ID).sum())
            needed[idx] = chars_needed(hit, data.n_context[idx], data.word_len[idx])
        return {
            "top_k_eff": top_k_eff(data.word_len, needed),
            "perplexity": float(np.exp(ce_sum / count)),
            "chars_needed": needed,
        }
