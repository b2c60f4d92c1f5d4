"""Metric functions on NumPy arrays: DeepType's top-k input efficiency (Sec. 3.2), top-1
accuracy, and ROC AUC averaged over classes (MoIL's trapezoidal AUC for audio tagging)."""

from __future__ import annotations

import numpy as np


def typed_chars_needed(hits: np.ndarray, n_context: int, word_len: int) -> int:
    """R(x): fewest typed characters after which x is in the top-k (len(x) if never).

    hits[t] is whether x was suggested at position t of the sample; i typed characters is
    position n_context - 1 + i, and i = 0 exists only when the word has previous words.
    """
    for i in range(0 if n_context else 1, word_len + 1):
        if hits[n_context - 1 + i]:
            return i
    return word_len


def chars_needed(hits: np.ndarray, n_context: np.ndarray, word_len: np.ndarray) -> np.ndarray:
    """`typed_chars_needed` of a whole batch at once (hits[b, t]: sample b's row), without a loop
    over samples: evaluation scores every word of every user."""
    hits, n_context, word_len = np.asarray(hits, bool), np.asarray(n_context), np.asarray(word_len)
    typed = np.arange(int(word_len.max(initial=0)) + 1)[None, :]  # i typed characters
    valid = (typed >= (n_context == 0)[:, None]) & (typed <= word_len[:, None])
    position = np.clip(n_context[:, None] - 1 + typed, 0, hits.shape[1] - 1)
    shown = valid & hits[np.arange(len(hits))[:, None], position]
    return np.where(shown.any(axis=1), shown.argmax(axis=1), word_len).astype(np.int32)


def top_k_eff(word_len: np.ndarray, chars_needed: np.ndarray) -> float:
    """sum(len(x) - R(x)) / sum(len(x)): the share of typing the suggestions save."""
    word_len = np.asarray(word_len)
    return float(np.sum(word_len - np.asarray(chars_needed)) / np.sum(word_len))


def accuracy(labels: np.ndarray, logits: np.ndarray) -> float:
    """Top-1 accuracy."""
    return float(np.mean(np.argmax(logits, axis=-1) == np.asarray(labels)))


def roc_auc(positive: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of one class (ties count half); NaN without both classes."""
    positive = np.asarray(positive, bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = np.asarray(scores)[order]
    # average ranks over ties
    _, start, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    for s, c in zip(start, counts):
        ranks[order[s : s + c]] = s + (c + 1) / 2
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def mean_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC averaged over the classes that have both positives and negatives."""
    aucs = [roc_auc(labels[:, c], scores[:, c]) for c in range(labels.shape[1])]
    return float(np.nanmean(aucs))
