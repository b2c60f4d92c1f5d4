"""Dynamic vocabulary (DeepType Sec. 4): a per-user vocabulary made on the phone before personal
training. Words the user typed at least `min_count` times that the global vocabulary lacks take
the ids of global words the user never typed (the paper: words "used more than a threshold";
our `min_count` is that threshold plus one).

Our reading of the paper, and the choices where it is silent:
- "Used" means typed in the user's local history, the text the personal model trains on; a
  global word the user typed even once is kept.
- The replacement is "directly applied on the vocabulary entries": the model does not change.
  A new word inherits the id of the word it replaces, hence that word's input embedding row and
  its softmax column (kernel and bias), which personal training then adapts. Nothing is
  re-initialised, and the vocabulary and the model keep their sizes.
- The paper does not say which never-used words go first, nor the threshold. We replace the
  least frequent global words first (the vocabulary is ordered by crowd frequency, so the
  highest ids first), and the most frequent new words get a slot first (ties alphabetical).
- Samples are then built with the user's vocabulary: a swapped-in word becomes a label the model
  can suggest, and a replaced global word becomes <unk> for this user (never suggested).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ondevice.data.typing_samples import UNK_ID, Vocabulary

# the default `min_count` of D3 and D4 (`dynamic_vocab_min_count`): the paper names no threshold ("used
# more than a threshold"); D4 chose "typed at least twice" when it was built, before any run, and D3 reuses it
MIN_COUNT = 2


@dataclass(frozen=True)
class VocabSwap:
    """A user's vocabulary and which global entries it replaced."""

    vocab: Vocabulary  # the global vocabulary with the swapped entries
    ids: tuple[int, ...]  # the reused ids, in the order the new words were given them
    added: tuple[str, ...]  # the user's words now at those ids
    replaced: tuple[str, ...]  # the global words that were there
    counts: tuple[int, ...]  # how often the user typed each added word

    @property
    def size(self) -> int:
        return len(self.ids)


def frequent_new_words(history: list[list[str]], vocab: Vocabulary, min_count: int) -> list[tuple[str, int]]:
    """(word, count) of the words typed at least `min_count` times that `vocab` lacks, most frequent first."""
    if min_count < 1:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    counts = Counter(w for sentence in history for w in sentence)
    new = [(w, n) for w, n in counts.items() if n >= min_count and vocab.word_id(w) == UNK_ID]
    return sorted(new, key=lambda wn: (-wn[1], wn[0]))


def unused_ids(history: list[list[str]], vocab: Vocabulary) -> np.ndarray:
    """Ids of the global words the user never typed, least frequent (highest id) first;
    <pad> and <unk> are never free."""
    used = {w for sentence in history for w in sentence}
    return np.array([i for i in range(vocab.size - 1, UNK_ID, -1) if vocab.words[i] not in used], np.int64)


def swap(vocab: Vocabulary, history: list[list[str]], min_count: int) -> VocabSwap:
    """The user's vocabulary: frequent out-of-vocabulary words take the ids of unused global words.

    When there are more new words than free ids, the most frequent new words win.
    """
    new = frequent_new_words(history, vocab, min_count)
    free = unused_ids(history, vocab)[: len(new)]
    new = new[: len(free)]
    words = list(vocab.words)
    for i, (word, _) in zip(free, new):
        words[i] = word
    return VocabSwap(
        Vocabulary(tuple(words)),
        tuple(int(i) for i in free),
        tuple(w for w, _ in new),
        tuple(vocab.words[i] for i in free),
        tuple(n for _, n in new),
    )
