"""Word n-gram baselines of DeepType's Fig. 1b: interpolated Kneser-Ney n-gram models, with and
without filtering the suggestions by the typed characters.

The model predicts over the same word vocabulary as the LSTM (ids: 0 <pad>, never predicted;
1 <unk>; 2.. words) from the previous n-1 words of the sentence, padded with a begin-of-sentence
token (id = vocabulary size). No end-of-sentence event is modelled, because the LSTM has none:
the two models' word probabilities are then over the same events and their perplexities compare.

Interpolated Kneser-Ney (Chen & Goodman 1998, with one absolute discount per order,
D = n1 / (n1 + 2 n2)): the highest order uses raw counts, every lower order uses continuation
counts (how many distinct words precede an n-gram), and the unigram order is interpolated with
the uniform distribution, so every word gets probability and each distribution sums to 1.
Everything is vectorised over a batch of histories with sparse count matrices, because scoring
needs the full distribution at every test word (a keyboard ranks all words); a library that scores
one word per Python call would take minutes for one user here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from ..data.typing_samples import PAD_ID, UNK_ID, Samples, Vocabulary
from ..metrics import typed_chars_needed


@dataclass
class _Order:
    """Counts of one order: context keys (sorted), a (contexts x vocabulary) count matrix, the
    discount, and per context the total count and the number of distinct following words."""

    keys: np.ndarray
    counts: sparse.csr_matrix
    discount: float
    total: np.ndarray
    types: np.ndarray


def _discount(values: np.ndarray) -> float:
    n1, n2 = int(np.sum(values == 1)), int(np.sum(values == 2))
    return n1 / (n1 + 2 * n2) if n1 + n2 else 0.5


class KneserNey:
    """An interpolated Kneser-Ney word model of a given order over a fixed vocabulary."""

    def __init__(self, order: int, vocab_size: int, orders: list[_Order]):
        self.order, self.vocab_size, self.orders = order, vocab_size, orders
        self.bos = vocab_size
        self._uniform = np.full(vocab_size, 1.0 / (vocab_size - 1))
        self._uniform[PAD_ID] = 0.0

    @classmethod
    def fit(cls, sentences: list[list[int]], order: int, vocab_size: int) -> "KneserNey":
        """Count the n-grams of id sentences (ids < vocab_size; <pad> must not occur)."""
        if order < 1:
            raise ValueError(f"order must be at least 1, got {order}")
        if vocab_size < 3:
            raise ValueError(f"vocab_size must be at least 3, got {vocab_size}")
        bos, n = vocab_size, order
        flat = (
            np.concatenate([np.r_[[bos] * (n - 1), s] for s in sentences if len(s)]).astype(np.int64)
            if any(len(s) for s in sentences)
            else np.zeros(0, np.int64)
        )
        if flat.size and (flat.min() < 0 or flat.max() > bos or np.any(flat == PAD_ID)):
            raise ValueError("sentence ids must be in 1..vocab_size-1 (<pad> cannot be a word)")
        ends = np.flatnonzero(flat != bos)  # every real word ends one n-gram; BOS padding keeps it in its sentence
        windows = (
            np.stack([flat[ends - (n - 1 - j)] for j in range(n)], axis=1) if ends.size else np.zeros((0, n), np.int64)
        )
        orders, grams = [], windows
        for m in range(n, 0, -1):
            grams_m = grams[:, n - m :]  # the last m tokens of each window
            if m == n:
                unique, values = np.unique(grams_m, axis=0, return_counts=True)
            else:  # continuation count: distinct words before the m-gram, i.e. distinct (m+1)-grams
                unique, values = np.unique(np.unique(grams[:, n - m - 1 :], axis=0)[:, 1:], axis=0, return_counts=True)
            orders.append(cls._table(unique, values, vocab_size))
        return cls(order, vocab_size, orders[::-1])  # orders[m-1] is order m

    @staticmethod
    def _table(grams: np.ndarray, values: np.ndarray, vocab_size: int) -> _Order:
        keys_all = _context_keys(grams[:, :-1], vocab_size)
        keys, rows = np.unique(keys_all, return_inverse=True)
        counts = sparse.csr_matrix((values.astype(float), (rows, grams[:, -1])), shape=(len(keys), vocab_size))
        total = np.asarray(counts.sum(axis=1)).ravel()
        return _Order(keys, counts, _discount(values), total, np.diff(counts.indptr))

    def probabilities(self, histories: np.ndarray) -> np.ndarray:
        """P(word | history) over the vocabulary, one row per history.

        histories: (batch, order-1) ids of the previous words, oldest first, BOS-padded; extra
        older columns are ignored."""
        histories = np.asarray(histories, np.int64).reshape(len(histories), -1)
        if histories.shape[1] < self.order - 1:
            raise ValueError(
                f"a {self.order}-gram model needs {self.order - 1} previous words per history, got {histories.shape[1]}"
            )
        low = self.orders[0]
        unigram = (
            (np.maximum(low.counts.toarray()[0] - low.discount, 0) + low.discount * low.types[0] * self._uniform)
            / low.total[0]
            if low.total.size
            else self._uniform
        )
        probs = np.broadcast_to(unigram, (len(histories), self.vocab_size)).copy()
        for m in range(2, self.order + 1):
            table = self.orders[m - 1]
            ctx = _context_keys(histories[:, histories.shape[1] - (m - 1) :], self.vocab_size)
            pos = np.searchsorted(table.keys, ctx)
            seen = (
                (pos < len(table.keys)) & (table.keys[np.minimum(pos, len(table.keys) - 1)] == ctx)
                if len(table.keys)
                else np.zeros(len(ctx), bool)
            )
            if not seen.any():
                continue
            rows = pos[seen]
            counts = table.counts[rows].toarray()
            d = table.discount
            probs[seen] = (np.maximum(counts - d, 0) + (d * table.types[rows])[:, None] * probs[seen]) / table.total[
                rows
            ][:, None]
        return probs


def _context_keys(contexts: np.ndarray, vocab_size: int) -> np.ndarray:
    """One int64 per context row (ids in 0..vocab_size, the last one BOS)."""
    keys = np.zeros(len(contexts), np.int64)
    for j in range(contexts.shape[1]):
        keys = keys * (vocab_size + 1) + contexts[:, j]
    return keys


class PrefixFilter:
    """Which vocabulary words are consistent with a typed prefix: the words sorted by spelling,
    so the words starting with a prefix are one contiguous range of that order."""

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.order = np.argsort(np.asarray(vocab.words, dtype=object), kind="stable")
        self.sorted_words = [vocab.words[i] for i in self.order]
        shown = np.ones(vocab.size, bool)
        shown[[PAD_ID, UNK_ID]] = False  # a keyboard suggests words, never <pad> or <unk>
        self.shown_sorted = shown[self.order]

    def range(self, prefix: str) -> tuple[int, int]:
        """[lo, hi) in sorted order of the words that start with prefix (every shown word for '')."""
        if not prefix:
            return 0, self.vocab.size
        lo = bisect.bisect_left(self.sorted_words, prefix)
        hi = bisect.bisect_left(self.sorted_words, prefix + "\uffff")
        return lo, hi

    def suggest(self, probs: np.ndarray, prefix: str, k: int, filtered: bool = True) -> list[str]:
        """The k most probable shown words, among those starting with `prefix` when filtered."""
        lo, hi = self.range(prefix if filtered else "")
        scores = np.where(self.shown_sorted, probs[self.order], -np.inf)[lo:hi]
        best = np.argsort(-scores, kind="stable")[:k]
        return [self.sorted_words[lo + i] for i in best if np.isfinite(scores[i])]


def histories(samples: Samples, n_previous: int, bos: int) -> np.ndarray:
    """The previous `n_previous` words of each sample's word (its context inputs), BOS-padded
    on the left; a sample stores at most `context_words` of them, so n_previous must not exceed it."""
    out = np.full((len(samples), n_previous), bos, np.int64)
    for j in range(len(samples)):
        nc = int(samples.n_context[j])
        take = min(nc, n_previous)
        if take:
            a = samples.offsets[j] + nc
            out[j, n_previous - take :] = samples.inputs[a - take : a]
    return out


def chars_needed(
    model: KneserNey, samples: Samples, filt: PrefixFilter, k: int, prefix_filter: bool, batch_size: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """R(x) of every sample (DeepType's top-k-eff, as `metrics` reads it for the LSTM) and the
    log-probability of each typed word given its previous words.

    After i typed characters the suggestions are the k most probable shown words, among those
    starting with the i characters when `prefix_filter` (otherwise the same k words at every i).
    Ties count against the word and an out-of-vocabulary word is never suggested, as for the LSTM.
    """
    if len(samples) == 0:
        raise ValueError("cannot score an empty sample set")
    words = filt.vocab.words
    needed = np.zeros(len(samples), np.int32)
    log_prob = np.zeros(len(samples))
    hist = histories(samples, model.order - 1, model.bos)
    max_len = int(samples.word_len.max())
    full = np.array([0, filt.vocab.size])
    for start in range(0, len(samples), batch_size):
        idx = np.arange(start, min(start + batch_size, len(samples)))
        probs = model.probabilities(hist[idx])
        target = samples.target[idx]
        p_x = probs[np.arange(len(idx)), target]
        log_prob[idx] = np.log(p_x)
        ge = (probs[:, filt.order] >= p_x[:, None]) & filt.shown_sorted
        cum = np.concatenate([np.zeros((len(idx), 1), np.int32), np.cumsum(ge, axis=1, dtype=np.int32)], axis=1)
        for row, j in enumerate(idx):
            x, wl, nc = int(target[row]), int(samples.word_len[j]), int(samples.n_context[j])
            hits = np.zeros(max_len + 1, bool)
            if x != UNK_ID:
                bounds = (
                    np.array([filt.range(words[x][:i]) for i in range(wl + 1)])
                    if prefix_filter
                    else np.broadcast_to(full, (wl + 1, 2))
                )
                rank = (
                    cum[row, bounds[:, 1]] - cum[row, bounds[:, 0]] - 1
                )  # shown words at least as probable, x excluded
                hits[: wl + 1] = rank < k
            # hits[i] is the suggestion after i typed characters; metrics reads position n_context-1+i
            needed[j] = typed_chars_needed(hits, 1, wl) if nc else typed_chars_needed(hits[1:], 0, wl)
    return needed, log_prob
