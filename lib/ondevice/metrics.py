"""Metrics: DeepType's top-k input efficiency (Sec. 3.2) and perplexity."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .data.typing_samples import PAD_ID, UNK_ID, Samples


def masked_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Sum of per-position cross-entropy over real positions (label != <pad>) and their count."""
    mask = tf.cast(tf.not_equal(labels, PAD_ID), logits.dtype)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(ce * mask), tf.reduce_sum(mask)


@tf.function(reduce_retracing=True)
def _position_scores(logits, labels, k):
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
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return hit, ce


def typed_chars_needed(hits: np.ndarray, n_context: int, word_len: int) -> int:
    """R(x): fewest typed characters after which x is in the top-k (len(x) if never).

    hits[t] is whether x was suggested at position t of the sample; i typed characters is
    position n_context - 1 + i, and i = 0 exists only when the word has previous words.
    """
    for i in range(0 if n_context else 1, word_len + 1):
        if hits[n_context - 1 + i]:
            return i
    return word_len


def top_k_eff(word_len: np.ndarray, chars_needed: np.ndarray) -> float:
    """sum(len(x) - R(x)) / sum(len(x)): the share of typing the suggestions save."""
    word_len = np.asarray(word_len)
    return float(np.sum(word_len - np.asarray(chars_needed)) / np.sum(word_len))


def evaluate(model, samples: Samples, k: int, batch_size: int = 256) -> dict:
    """top-k-eff and perplexity of a model on samples, plus R(x) per sample."""
    if len(samples) == 0:
        raise ValueError("cannot evaluate on an empty sample set")
    needed = np.zeros(len(samples), np.int32)
    ce_sum, count = 0.0, 0
    for start in range(0, len(samples), batch_size):
        idx = np.arange(start, min(start + batch_size, len(samples)))
        x, y = samples.padded(idx)
        hit, ce = _position_scores(model(x, training=False), tf.constant(y), tf.constant(k))
        hit, ce = hit.numpy(), ce.numpy()
        ce_sum += float(ce[y != PAD_ID].sum())
        count += int((y != PAD_ID).sum())
        for row, j in enumerate(idx):
            needed[j] = typed_chars_needed(hit[row], int(samples.n_context[j]), int(samples.word_len[j]))
    return {
        "top_k_eff": top_k_eff(samples.word_len, needed),
        "perplexity": float(np.exp(ce_sum / count)),
        "chars_needed": needed,
    }
