"""EDA, "Easy Data Augmentation" (Wei and Zou, EMNLP-IJCNLP 2019), as AutLearn uses it for text (Sec. 3.4).

Four operations on a sentence of n words, each with its rate (the authors' default 0.1 for all):
- synonym replacement (SR): pick max(1, alpha_sr*n) distinct non-stop words in random order and
  replace every occurrence of each by a random WordNet synonym (words without one are skipped);
- random insertion (RI): max(1, alpha_ri*n) times, a random synonym of a random non-stop word
  (up to 10 tries to find a word that has one) goes to a random position;
- random swap (RS): max(1, alpha_rs*n) times, two random positions exchange their words (up to 3
  tries to draw a second position differing from the first);
- random deletion (RD): each word goes with probability p_rd; a one-word sentence is kept, and
  if every word went, one random word of the original stays.
`augment` makes int(n_aug/4) + 1 sentences per operation, shuffles them and keeps n_aug (or,
below 1, each with probability n_aug), the authors' recipe. AutLearn generates up to 5x the data
but trains on at most 1x more: `augment_corpus` samples the generated sentences down to
`cap` x the original count. Synonyms may be several words (`look after`), so sentences are
re-tokenised after SR and RI, as the authors do. Every random draw comes from the numpy
Generator passed in, so a seed fixes the output.
"""

from __future__ import annotations

import re

import numpy as np

OPERATIONS = ("sr", "ri", "rs", "rd")
# English function words, never replaced by or given synonyms (EDA skips stop words in SR and RI).
# Ours, written for this module: pronouns, determiners, auxiliaries, prepositions, conjunctions,
# and the archaic forms Shakespeare's users type.
STOP_WORDS = frozenset(
    """
a about above after again against all am an and any are as at be been before being below between both but by
can could did do does doing down during each few for from further had has have having he her here hers herself
him himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only
or other our ours ourselves out over own same she should so some such than that the their theirs them themselves
then there these they this those through to too under until up very was we were what when where which while who
whom why will with would you your yours yourself yourselves
thou thee thy thine ye art hath doth dost shalt wilt shall o
""".split()
)
_NOT_LETTER = re.compile(r"[^a-z ]+")


def clean(text: str) -> list[str]:
    """Lower-cased words of letters only, the form EDA works on (and its synonyms are put into)."""
    return _NOT_LETTER.sub(" ", text.lower().replace("-", " ").replace("'", "")).split()


class EDA:
    """The four operations over one synonym dictionary (`synonyms(word) -> tuple of str`, e.g.
    `data.wordnet.WordNet.synonyms`), with the authors' rates as defaults."""

    def __init__(
        self,
        synonyms,
        alpha_sr: float = 0.1,
        alpha_ri: float = 0.1,
        alpha_rs: float = 0.1,
        p_rd: float = 0.1,
        operations: tuple[str, ...] = OPERATIONS,
        stop_words=STOP_WORDS,
    ):
        for name, value in (("alpha_sr", alpha_sr), ("alpha_ri", alpha_ri), ("alpha_rs", alpha_rs), ("p_rd", p_rd)):
            if not 0 <= value <= 1:
                raise ValueError(f"EDA {name} must be in [0, 1], got {value!r}")
        unknown = sorted(set(operations) - set(OPERATIONS))
        if unknown or not operations:
            raise ValueError(f"EDA operations must be a non-empty subset of {OPERATIONS}, got {operations!r}")
        self._synonyms, self.stop_words = synonyms, frozenset(stop_words)
        self.alpha_sr, self.alpha_ri, self.alpha_rs, self.p_rd = alpha_sr, alpha_ri, alpha_rs, p_rd
        self.operations = tuple(operations)

    def synonyms(self, word: str) -> list[str]:
        """The dictionary's synonyms in EDA's form (letters and spaces), the word itself left out."""
        out = {" ".join(clean(s)) for s in self._synonyms(word)}
        out.discard(word)
        out.discard("")
        return sorted(out)

    def _content_words(self, words: list[str]) -> list[str]:
        return list(dict.fromkeys(w for w in words if w not in self.stop_words))

    def synonym_replacement(self, words: list[str], n: int, rng: np.random.Generator) -> list[str]:
        out, replaced = list(words), 0
        candidates = self._content_words(words)
        for i in rng.permutation(len(candidates)):
            options = self.synonyms(candidates[i])
            if options:
                choice = options[rng.integers(len(options))]
                out = [choice if w == candidates[i] else w for w in out]
                replaced += 1
                if replaced >= n:
                    break
        return " ".join(out).split()

    def random_insertion(self, words: list[str], n: int, rng: np.random.Generator) -> list[str]:
        out = list(words)
        for _ in range(n):
            candidates = [w for w in out if w not in self.stop_words]
            for _try in range(10):
                if not candidates:
                    break
                options = self.synonyms(candidates[rng.integers(len(candidates))])
                if options:
                    out.insert(int(rng.integers(len(out) + 1)), options[rng.integers(len(options))])
                    break
        return " ".join(out).split()

    def random_swap(self, words: list[str], n: int, rng: np.random.Generator) -> list[str]:
        out = list(words)
        if len(out) < 2:
            return out
        for _ in range(n):
            i = j = int(rng.integers(len(out)))
            for _try in range(3):
                j = int(rng.integers(len(out)))
                if j != i:
                    break
            out[i], out[j] = out[j], out[i]
        return out

    def random_deletion(self, words: list[str], p: float, rng: np.random.Generator) -> list[str]:
        if len(words) <= 1:
            return list(words)
        keep = rng.random(len(words)) > p
        if not keep.any():
            return [words[rng.integers(len(words))]]
        return [w for w, k in zip(words, keep) if k]

    def apply(self, op: str, words: list[str], rng: np.random.Generator) -> list[str]:
        """One operation ("sr", "ri", "rs", "rd") at this EDA's strength: a share of the sentence's
        words (at least one), or for deletion a probability per word."""
        if op == "rd":
            return self.random_deletion(words, self.p_rd, rng)
        n = max(1, int(getattr(self, f"alpha_{op}") * len(words)))
        return {"sr": self.synonym_replacement, "ri": self.random_insertion, "rs": self.random_swap}[op](words, n, rng)

    def augment(self, words: list[str], n_aug: float, rng: np.random.Generator) -> list[list[str]]:
        """Up to n_aug new sentences from one (the original is not among them)."""
        if n_aug < 0:
            raise ValueError(f"EDA n_aug must be >= 0, got {n_aug!r}")
        if not words:
            return []
        per_op = int(n_aug / len(self.operations)) + 1
        made = [self.apply(op, words, rng) for op in self.operations for _ in range(per_op)]
        made = [made[i] for i in rng.permutation(len(made))]
        if n_aug >= 1:
            return made[: int(n_aug)]
        return [s for s, r in zip(made, rng.random(len(made))) if r < n_aug]


def augment_corpus(
    eda: EDA, sentences: list[list[str]], rng: np.random.Generator, n_aug: float = 4, cap: float = 1.0
) -> list[list[str]]:
    """Generated sentences for a user's training sentences, sampled down (uniformly, without
    replacement) to at most `cap` x len(sentences); the originals are not included."""
    if cap < 0:
        raise ValueError(f"augmentation cap must be >= 0, got {cap!r}")
    made = [s for words in sentences for s in eda.augment(words, n_aug, rng)]
    limit = int(cap * len(sentences))
    if len(made) > limit:
        made = [made[i] for i in np.sort(rng.choice(len(made), limit, replace=False))]
    return made
