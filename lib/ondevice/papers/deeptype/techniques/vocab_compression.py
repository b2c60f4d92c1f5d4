"""Vocabulary compression (DeepType Sec. 5.2): on the phone, the softmax keeps only the columns
of words that occur in the user's own history (plus <pad> and <unk>).

The compressed softmax has n' <= V outputs; kept words get new ids 0..n'-1 in the order of their
old ids, so <pad> stays 0 and <unk> stays 1. The same id map (`VocabMap.remap`) is applied to
the labels of the training samples and of the test samples, so training, inference and
evaluation agree. A test word that is not in the user's history (or not in the global
vocabulary) becomes <unk>, which is never suggested: its characters all have to be typed. That is
exactly the paper's trade-off: a smaller, faster softmax for a word the user never typed before.
Perplexities of a compressed model are over its n' words and so not comparable with the full
model's; top-k-eff is (it only counts typed characters).

The input side (the embedding of words and characters) is unchanged: only the softmax is cut.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tf_keras as keras

from ondevice.data.typing_samples import PAD_ID, UNK_ID, Samples
from ondevice.models.svd_compression import SOFTMAX, replace_softmax


@dataclass(frozen=True)
class VocabMap:
    """Old word ids that are kept (sorted, starting with <pad>, <unk>) and the old -> new lookup."""

    kept: np.ndarray  # int32, n'
    lookup: np.ndarray  # int32, V: new id of each old id, UNK_ID for dropped words

    @classmethod
    def from_history(cls, history: Samples, vocab_size: int) -> "VocabMap":
        """Every word the user typed in `history` (each word is the target of its own sample)."""
        used = np.unique(np.concatenate([history.target, history.labels]).astype(np.int64))
        kept = np.union1d([PAD_ID, UNK_ID], used).astype(np.int32)
        if kept.max() >= vocab_size:
            raise ValueError(f"word id {kept.max()} is outside the vocabulary of {vocab_size}")
        lookup = np.full(vocab_size, UNK_ID, np.int32)
        lookup[kept] = np.arange(len(kept), dtype=np.int32)
        return cls(kept, lookup)

    @property
    def size(self) -> int:
        return len(self.kept)

    def remap(self, samples: Samples) -> Samples:
        """The same samples with labels and targets in compressed ids (inputs unchanged)."""
        return replace(samples, labels=self.lookup[samples.labels], target=self.lookup[samples.target])


def compress(model: keras.Model, vocab_map: VocabMap) -> keras.Model:
    """The model with its `softmax` cut to the kept columns (kernel and bias); works on the full
    model and on an SVD-compressed one (whose `softmax` is the t -> V layer)."""
    kernel, bias = model.get_layer(SOFTMAX).get_weights()
    kept = vocab_map.kept

    def head(features):
        out = keras.layers.Dense(len(kept), name=SOFTMAX)
        logits = out(features)
        out.set_weights([kernel[:, kept], bias[kept]])
        return logits

    return replace_softmax(model, head, f"{model.name}_vocab{len(kept)}")
