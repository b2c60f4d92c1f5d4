"""DeepType's typing protocol, shared by DeepType's experiments and AutLearn's availability
notebook: its parameters with their presets per scale, and the LSTM they describe."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ondevice import params as _params
from ondevice import streams
from ondevice.data import shakespeare
from ondevice.data.per_user_text import Corpus
from ondevice.data.splits import SplitRule
from ondevice.models import lstm_lm
from ondevice.params import Params
from ondevice.tasks.next_word import NextWordTask

# The LSTM and its global training per scale (the paper's values are the dataclass defaults).
MODEL_PRESETS = {
    "smoke": dict(vocab_size=800, embedding_dim=32, hidden_units=48, context_words=3),
    "default": dict(vocab_size=5000, embedding_dim=64, hidden_units=128, context_words=3),
    "paper": {},
}
# The global regime is TensorFlow's PTB LSTM, which the paper follows (Sec. 2): SGD at 1.0 on the
# loss summed over a sample's positions, gradients clipped at norm 5, the rate halved every epoch
# after the 4th, up to 13 epochs (PTB small; our default LSTM is smaller than its 200 units, so no
# dropout); it stops earlier when two epochs in a row lower the held-out global text's loss by less
# than 1%, keeping the best epoch. Paper scale (400 units, between PTB small and medium) takes the
# medium recipe: dropout 0.5, decay 0.8 after epoch 6, up to 39 epochs. Adam 0.002 on the
# per-position mean, the suite's earlier regime, is one of `sensitivity`'s switches.
GLOBAL_PRESETS = {
    "smoke": dict(crowd_max_words=12000, global_epochs=2, global_holdout_words=1500),
    "default": dict(crowd_max_words=0, global_epochs=13, global_min_improvement=0.01, global_holdout_words=20000),
    "paper": dict(global_epochs=39, global_seeds=3, dropout=0.5, global_lr_decay=0.8, global_decay_after=6),
}
SPLIT_PRESETS = {s: dataclasses.asdict(r) for s, r in shakespeare.SPLITS.items()}
# Every DeepType experiment's presets, and AutLearn's availability's, start from these
# (`ondevice.params.presets`).
PRESETS = _params.presets(MODEL_PRESETS, GLOBAL_PRESETS, SPLIT_PRESETS, {"smoke": dict(bootstrap=500)})


def presets(extra: dict[str, dict]) -> dict[str, dict]:
    """The shared presets plus an experiment's own fields (same as `ondevice.params.presets(PRESETS, extra)`)."""
    return _params.presets(PRESETS, extra)


@dataclass(frozen=True)
class DeepTypeParams(Params):
    """Fields every DeepType notebook (and AutLearn's availability) has; an experiment subclasses it
    with its own."""

    corpus: str = ""  # a per-user JSON Lines file (ondevice.data.user_text); "" = Shakespeare
    k: int = 3  # suggestions shown (top-k)
    vocab_size: int = 20000  # output words incl. <pad> and <unk>; paper: 20K
    embedding_dim: int = 400
    hidden_units: int = 400  # paper's softmax input is 400 wide (Sec. 5.1)
    lstm_layers: int = 2
    context_words: int = 10  # previous words of the sentence in each sample
    crowd_max_words: int = 0  # words of crowd text for the global model; 0 = all
    test_users: int = 20  # the user split (shared by every notebook on this data set)
    test_min_words: int = 3000
    validation_users: int = 10
    validation_min_words: int = 2000
    validation_max_words: int = 3000
    # The crowd leaves out the test and validation users' plays (their other roles share the test
    # period's scenes: 718 of 1,343 crowd roles did before); False is the old rule, users only.
    crowd_excludes_groups: bool = True
    personal_train_fraction: float = 0.7
    global_epochs: int = 13  # at most; training stops earlier at a plateau of the hold-out loss
    global_holdout_words: int = 50000  # global text held out (random sentences) for early stopping; 0 = none
    global_patience: int = 2  # epochs without improvement before stopping
    global_min_improvement: float = 0.01  # relative drop of the hold-out loss that counts as improvement
    global_seeds: int = 1  # global models, for the first min(global_seeds, seeds) seeds; seed i uses model i % that
    global_batch_size: int = 128
    # The global regime (GLOBAL_PRESETS): TensorFlow's PTB LSTM, which the paper says it follows.
    optimizer: str = "sgd"  # the global model's optimizer
    global_learning_rate: float = 1.0
    global_clip_norm: float = 5.0  # gradients' global norm at most this (0 = no clipping)
    global_lr_decay: float = 0.5  # the rate is multiplied by this every epoch after `global_decay_after`
    global_decay_after: int = 4
    dropout: float = 0.0  # on the embedding and the LSTM outputs while training
    global_loss_per: str = "sample"  # "sample": summed over a sample's positions (PTB); "position": their mean
    # Personal (on-device incremental) training, Sec. 4.1 and Table 1: the global configuration but
    # batch 16, mini-batch gradient descent, 5 epochs (`protocol` trains with these fields only).
    personal_optimizer: str = "sgd"  # sgd | adam; adam starts from a fresh (zero) state per user
    personal_learning_rate: float = 1.0  # the PTB LSTM configuration DeepType follows ([13]): SGD at 1.0
    personal_clip_norm: float = 5.0  # as the global regime (0 = no clipping)
    personal_loss_per: str = "sample"  # as the global regime
    personal_epochs: int = 5  # at most, with a hold-out; exactly, without one
    personal_batch_size: int = 16
    # Convergence per user: the chronologically last part of a user's *training* lines is held out
    # and personal training keeps the epoch (0 = the global model) with the lowest loss on it,
    # stopping after `personal_patience` epochs without a lower one. 0 = the fixed-epoch protocol.
    personal_holdout_fraction: float = 0.2
    personal_patience: int = 2
    seeds: int = 1  # repeats over seeds seed, seed+1, ... (training only; the split and crowd use `seed`)
    bootstrap: int = 2000  # resamples of users for the effects' intervals

    def check(self) -> None:
        self.at_least(1, *"k embedding_dim hidden_units lstm_layers test_users test_min_words seeds".split())
        self.at_least(1, "global_epochs", "global_batch_size", "global_seeds", "global_patience", "personal_batch_size")
        self.at_least(
            0, "validation_users", "context_words", "crowd_max_words", "global_holdout_words", "personal_epochs"
        )
        self.at_least(3, "vocab_size")  # <pad>, <unk> and a word
        self.at_least(100, "bootstrap")
        for name in ("global_learning_rate", "personal_learning_rate", "global_lr_decay"):
            self.require(getattr(self, name) > 0, name, "must be positive")
        self.at_least(0, "global_clip_norm", "personal_clip_norm", "global_decay_after")
        self.require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)")
        for name in ("global_loss_per", "personal_loss_per"):
            self.require(getattr(self, name) in NextWordTask.LOSSES, name, f"must be one of {NextWordTask.LOSSES}")
        for name in ("optimizer", "personal_optimizer"):
            self.require(getattr(self, name) in ("adam", "sgd"), name, "must be 'adam' or 'sgd'")
        val, msg = self.validation_min_words < self.validation_max_words, "must be larger than validation_min_words"
        self.require(val, "validation_max_words", msg)
        self.require(self.k < self.vocab_size - 2, "k", "must be smaller than the number of words in the vocabulary")
        self.require(0 <= self.global_min_improvement < 1, "global_min_improvement", "must be in [0, 1)")
        msg = "must be a per-user JSON Lines file (user, timestamp, text) or empty for Shakespeare"
        self.require(not self.corpus or Path(self.corpus).is_file(), "corpus", msg)
        self.require(0 < self.personal_train_fraction < 1, "personal_train_fraction", "must be in (0, 1)")
        self.require(0 <= self.personal_holdout_fraction < 1, "personal_holdout_fraction", "must be in [0, 1)")
        self.at_least(1, "personal_patience")

    def at_least(self, minimum: float, *names: str) -> None:
        for name in names:
            self.require(getattr(self, name) >= minimum, name, f"must be at least {minimum}")

    def split_rule(self) -> SplitRule:
        names = ("test_users", "test_min_words", "validation_users", "validation_min_words", "validation_max_words")
        return SplitRule(*(getattr(self, n) for n in names), self.seed, self.crowd_excludes_groups)


def model_config(params: DeepTypeParams, corpus: Corpus) -> lstm_lm.LSTMConfig:
    sizes = (corpus.vocab.input_size, corpus.vocab.size, params.embedding_dim, params.hidden_units)
    return lstm_lm.LSTMConfig(*sizes, params.lstm_layers, params.dropout)


def build_model(params: DeepTypeParams, corpus: Corpus, seed: int):
    return lstm_lm.build(model_config(params, corpus), seed=streams.tf_seed(seed, "init/global"))
