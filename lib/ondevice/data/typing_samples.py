"""DeepType's training samples: one sample per typed word (DeepType Sec. 2).

A sample for the word x typed after the words w1..wn of its sentence is the input sequence
[w1, ..., wn, c1, ..., c_len(x)] (previous words, then x's characters one by one) with labels
[w2, ..., wn, x, x, ..., x]: each previous word predicts the next one, and from the last previous
word on, every prefix predicts x. The prediction at index n-1+i is the one shown after i typed
characters, which is what top-k-eff reads. Words and characters share one input embedding; the
output vocabulary is the words only.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1
CHARS = "abcdefghijklmnopqrstuvwxyz'"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")
_SENTENCE_END = re.compile(r"[.!?;:]+")


def sentences(text: str) -> list[list[str]]:
    """Lower-cased words of each sentence; a sentence ends at . ! ? ; or :."""
    out = []
    for part in _SENTENCE_END.split(text.lower()):
        words = _WORD.findall(part)
        if words:
            out.append(words)
    return out


@dataclass(frozen=True)
class Vocabulary:
    """Output words (ids 0..size-1, with <pad> and <unk>) followed by characters on the input side."""

    words: tuple[str, ...]

    @classmethod
    def from_sentences(cls, sents: list[list[str]], size: int) -> "Vocabulary":
        if size < 3:
            raise ValueError(f"vocab_size must be at least 3 (<pad>, <unk> and one word), got {size}")
        counts = Counter(w for s in sents for w in s)
        frequent = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: size - 2]
        return cls((PAD, UNK) + tuple(w for w, _ in frequent))

    @property
    def size(self) -> int:
        return len(self.words)

    @property
    def input_size(self) -> int:
        return self.size + len(CHARS)

    def __post_init__(self):
        object.__setattr__(self, "_index", {w: i for i, w in enumerate(self.words)})

    def word_id(self, word: str) -> int:
        return self._index.get(word, UNK_ID)

    def char_id(self, char: str) -> int:
        return self.size + CHARS.index(char)


@dataclass
class Samples:
    """Variable-length samples stored flat: sample j is inputs[offsets[j]:offsets[j+1]]."""

    inputs: np.ndarray  # int32, all samples concatenated
    labels: np.ndarray  # int32, same length
    offsets: np.ndarray  # int64, n+1
    n_context: np.ndarray  # int32, previous words in each sample
    word_len: np.ndarray  # int32, characters of the typed word
    target: np.ndarray  # int32, id of the typed word (UNK_ID when out of vocabulary)

    def __len__(self) -> int:
        return len(self.n_context)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def digest(self) -> str:
        """sha256 of the samples' content: equal samples, equal digest."""
        h = hashlib.sha256()
        for a in (self.inputs, self.labels, self.offsets, self.n_context, self.word_len, self.target):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def padded(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and labels of the chosen samples, right-padded with 0 to the longest of them.

        Right padding keeps every real position's output exact for a forward LSTM; the label 0
        (<pad>) marks positions the loss and the metrics ignore.
        """
        idx = np.asarray(idx)
        lengths = self.lengths[idx]
        column = np.arange(int(lengths.max()))[None, :]
        real = column < lengths[:, None]
        flat = np.where(real, self.offsets[idx][:, None] + column, 0)
        x = np.where(real, self.inputs[flat], 0).astype(np.int32)
        y = np.where(real, self.labels[flat], 0).astype(np.int32)
        return x, y


def build_samples(sents: list[list[str]], vocab: Vocabulary, context_words: int) -> Samples:
    """One sample per word; at most `context_words` previous words of the same sentence."""
    if context_words < 0:
        raise ValueError(f"context_words must be >= 0, got {context_words}")
    inputs, labels, lengths, n_ctx, word_len, target = [], [], [], [], [], []
    for sent in sents:
        ids = [vocab.word_id(w) for w in sent]
        for pos, word in enumerate(sent):
            ctx = ids[max(0, pos - context_words) : pos]
            chars = [vocab.char_id(c) for c in word]
            inputs += ctx + chars
            labels += ctx[1:] + [ids[pos]] * (len(chars) + (1 if ctx else 0))
            lengths.append(len(ctx) + len(chars))
            n_ctx.append(len(ctx))
            word_len.append(len(word))
            target.append(ids[pos])
    return Samples(
        np.asarray(inputs, np.int32),
        np.asarray(labels, np.int32),
        np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
        np.asarray(n_ctx, np.int32),
        np.asarray(word_len, np.int32),
        np.asarray(target, np.int32),
    )


def batch_indices(samples: Samples, batch_size: int, rng: np.random.Generator | None, bucket: bool = True):
    """Index arrays of mini-batches. Shuffled when rng is given; with bucket=True, samples of similar
    length go together (sorted within windows of 50 batches) so little time is spent on padding."""
    n = len(samples)
    order = rng.permutation(n) if rng is not None else np.arange(n)
    if bucket:
        window = batch_size * 50
        lengths = samples.lengths
        order = (
            np.concatenate(
                [
                    order[i : i + window][np.argsort(lengths[order[i : i + window]], kind="stable")]
                    for i in range(0, n, window)
                ]
            )
            if n
            else order
        )
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if rng is not None and bucket:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches
