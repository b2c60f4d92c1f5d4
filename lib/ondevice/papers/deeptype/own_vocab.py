"""Table 1's personalized rows with the dynamic vocabulary (`techniques.dynamic_vocab`): DeepType
swaps each user's vocabulary on the phone when it personalizes (Sec. 4, Fig. 6), so the paper's
personalized numbers are with it (Table 1's 0.616 is Fig. 7's P-M 100K; without it, P-M* 100K: 0.577).
A user's swap comes from their personal training lines alone (the hold-out part included, the test
lines never), and their samples are then built with it: a swapped-in word becomes a label the model
can suggest, a replaced global word becomes <unk>. The rows without it stay beside these."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice.data.per_user_text import Corpus
from ondevice.data.splits import split_history
from ondevice.data.typing_samples import UNK_ID
from ondevice.papers.deeptype.techniques import dynamic_vocab

SUFFIX = ", dynamic vocabulary"
DYNAMIC = "/dynamic"  # "<corpus>/dynamic": a user's data built with their own vocabulary


def condition(plain: str) -> str:
    """The dynamic-vocabulary twin of a personalized condition, e.g. "crowd global + personal, dynamic vocabulary"."""
    return plain + SUFFIX


def lines(corpus: Corpus, user: str, params) -> tuple[list, list]:
    """A user's personal training lines and test lines, split as `Corpus.personal_parts` splits them."""
    sents = corpus.users[user]
    return split_history(sents, [len(s) for s in sents], params.personal_train_fraction)


def user_swap(corpus: Corpus, user: str, params) -> dynamic_vocab.VocabSwap:
    """The user's vocabulary, from their personal training lines only (never their test lines)."""
    return dynamic_vocab.swap(corpus.vocab, lines(corpus, user, params)[0], params.dynamic_vocab_min_count)


def parts(corpora: dict[str, Corpus], user: str, params) -> dict:
    """A user's (fit, held, test) per corpus in its global vocabulary, and under "<corpus>/dynamic" in
    the user's: the same lines and split, so the two differ in the swapped words' ids only."""
    plain = {k: c.personal_parts(user, params) for k, c in corpora.items()}
    own = {k + DYNAMIC: c.personal_parts(user, params, user_swap(c, user, params).vocab) for k, c in corpora.items()}
    return plain | own


def oov_table(params, corpora: dict[str, Corpus]) -> pd.DataFrame:
    """Counting only, no model, per global text and test user: the words the swap adds, the share of
    test words out of the global vocabulary and out of the user's, and the share that are added words."""
    rows = []
    for corpus in corpora.values():
        for user in corpus.split.test:
            swap, test = user_swap(corpus, user, params), [w for s in lines(corpus, user, params)[1] for w in s]
            added = set(swap.added)
            rows.append(
                {
                    "global_text": corpus.global_text,
                    "user": user,
                    "added_words": swap.size,
                    "test_words": len(test),
                    "test_oov_global_vocab": corpus.oov(test),
                    "test_oov_user_vocab": float(np.mean([swap.vocab.word_id(w) == UNK_ID for w in test])),
                    "test_share_added_words": float(np.mean([w in added for w in test])),
                }
            )
    return pd.DataFrame(rows).assign(min_count=params.dynamic_vocab_min_count)
