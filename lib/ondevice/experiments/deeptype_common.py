"""What every DeepType notebook shares: the Shakespeare users and their split, the crowd text and
vocabulary, DeepType's samples, the LSTM, and the global model trained on the crowd (cached, so
the DeepType notebooks train it once per machine, not once each)."""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import streams
from ..data import manifests, shakespeare
from ..data.splits import SplitRule, UserSplit, make_split, split_history
from ..data.typing_samples import CHARS, UNK_ID, Samples, Vocabulary, build_samples
from ..models import lstm_lm
from ..params import ParameterError, Params
from ..results import provenance
from ..tasks.next_word import NextWordTask
from ..training import model_cache
from ..training.trainer import Trainer, seed_everything

DATASET = "shakespeare"

# Model and global-training fields per scale (the paper's values are the dataclass defaults).
MODEL_PRESETS = {
    "smoke": dict(vocab_size=800, embedding_dim=32, hidden_units=48, context_words=4,
                  crowd_max_words=12000, global_epochs=1),
    "default": dict(vocab_size=5000, embedding_dim=96, hidden_units=160, context_words=5,
                    crowd_max_words=150000, global_epochs=4),
    "paper": dict(),
}
# What decides the global model's weights: its cache key holds these fields, the seed, the split,
# the data's checksums and the code that trains it.
TRAINING_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm", "ondevice.streams")
GLOBAL_FIELDS = ("vocab_size", "embedding_dim", "hidden_units", "lstm_layers", "context_words",
                 "crowd_max_words", "global_epochs", "global_batch_size", "global_learning_rate", "optimizer")


def presets(extra: dict[str, dict]) -> dict[str, dict]:
    """A DeepType notebook's presets: the shared model and split presets plus its own fields."""
    return {scale: {**MODEL_PRESETS[scale], **dataclasses.asdict(shakespeare.SPLITS[scale]), **extra.get(scale, {})}
            for scale in MODEL_PRESETS}


@dataclass(frozen=True)
class DeepTypeParams(Params):
    """Fields every DeepType notebook has; an experiment subclasses it with its own."""

    k: int = 3                       # suggestions shown (top-k)
    vocab_size: int = 20000          # output words incl. <pad> and <unk>; paper: 20K
    embedding_dim: int = 400
    hidden_units: int = 400          # paper's softmax input is 400 wide (Sec. 5.1)
    lstm_layers: int = 2
    context_words: int = 10          # previous words of the sentence in each sample
    crowd_max_words: int = 0         # words of crowd text for the global model; 0 = all
    test_users: int = 20             # the user split (shared by every notebook on this data set)
    test_min_words: int = 3000
    validation_users: int = 10
    validation_min_words: int = 2000
    validation_max_words: int = 3000
    personal_train_fraction: float = 0.7
    global_epochs: int = 5
    global_batch_size: int = 128
    global_learning_rate: float = 0.002
    optimizer: str = "adam"          # adam | sgd, for global and personal training
    seeds: int = 1                   # repeats over seeds seed, seed+1, ... (training randomness only;
                                     # the split and the crowd sample use `seed` alone)

    def check(self) -> None:
        for name in ("k", "embedding_dim", "hidden_units", "lstm_layers", "test_users", "global_epochs",
                     "global_batch_size", "test_min_words", "seeds"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        self.require(self.validation_users >= 0, "validation_users", "must be >= 0")
        self.require(self.validation_min_words < self.validation_max_words, "validation_max_words",
                     "must be larger than validation_min_words")
        self.require(self.vocab_size >= 3, "vocab_size", "must be at least 3 (<pad>, <unk> and a word)")
        self.require(self.k < self.vocab_size - 2, "k", "must be smaller than the number of words in the vocabulary")
        self.require(self.context_words >= 0, "context_words", "must be >= 0")
        self.require(self.crowd_max_words >= 0, "crowd_max_words", "must be >= 0 (0 = all)")
        self.require(0 < self.personal_train_fraction < 1, "personal_train_fraction", "must be in (0, 1)")
        self.require(self.global_learning_rate > 0, "global_learning_rate", "must be positive")
        self.require(self.optimizer in ("adam", "sgd"), "optimizer", "must be 'adam' or 'sgd'")

    @property
    def seed_list(self) -> list[int]:
        return [self.seed + i for i in range(self.seeds)]

    def split_rule(self) -> SplitRule:
        return SplitRule(self.test_users, self.test_min_words, self.validation_users, self.validation_min_words,
                         self.validation_max_words, seed=self.seed)


@dataclass
class Corpus:
    """The data of a DeepType run: users, their split, the crowd's text, vocabulary and samples."""

    manifest: manifests.Manifest
    users: dict[str, list[list[str]]]
    split: UserSplit
    crowd: list[list[str]]
    vocab: Vocabulary
    crowd_samples: Samples
    context_words: int

    def personal(self, user: str, train_fraction: float) -> tuple[Samples, Samples]:
        """A user's earlier lines (training) and later lines (test) as samples."""
        sents = self.users[user]
        train, test = split_history(sents, [len(s) for s in sents], train_fraction)
        return build_samples(train, self.vocab, self.context_words), build_samples(test, self.vocab, self.context_words)

    def table(self) -> pd.DataFrame:
        """Users, words and out-of-vocabulary rate per role of the split."""
        rows = []
        for role, users in (("crowd", self.split.crowd), ("validation", self.split.validation), ("test", self.split.test)):
            words = [w for u in users for s in self.users[u] for w in s]
            rows.append({"role": role, "users": len(users), "words": len(words),
                         "oov_rate": float(np.mean([self.vocab.word_id(w) == UNK_ID for w in words])) if words else float("nan")})
        rows.append({"role": "crowd text of the global model", "users": len(self.split.crowd),
                     "words": sum(map(len, self.crowd)),
                     "oov_rate": float(np.mean([self.vocab.word_id(w) == UNK_ID for s in self.crowd for w in s]))})
        return pd.DataFrame(rows)

    def decode(self, sentence: str) -> pd.DataFrame:
        """DeepType's samples of one sentence, decoded (Sec. 2): one row per typed word, with the
        input steps (previous words, then the word's characters) and the label of each step."""
        from ..data.typing_samples import sentences

        samples = build_samples(sentences(sentence), self.vocab, self.context_words)
        name = lambda i: self.vocab.words[i] if i < self.vocab.size else f"'{CHARS[i - self.vocab.size]}'"
        rows = []
        for j, target in enumerate(samples.target):
            a, b = samples.offsets[j], samples.offsets[j + 1]
            rows.append({"typed word": self.vocab.words[target], "inputs": " ".join(map(name, samples.inputs[a:b])),
                         "labels": " ".join(map(name, samples.labels[a:b]))})
        return pd.DataFrame(rows)


def _crowd(users: dict, crowd_users, max_words: int, rng: np.random.Generator) -> list[list[str]]:
    """Sentences of the crowd; with max_words, a random subset of them up to that many words."""
    sents = [s for u in crowd_users for s in users[u]]
    if not max_words:
        return sents
    chosen, total = [], 0
    for i in rng.permutation(len(sents)):
        if total >= max_words:
            break
        chosen.append(sents[i])
        total += len(sents[i])
    return chosen


def load_corpus(params: DeepTypeParams, speeches=None, log=print) -> Corpus:
    """Read the data set through its manifest, split users, sample the crowd, build the vocabulary.

    Everything here depends on the data and the split seed only, never on the training seeds.
    """
    manifest = manifests.load(DATASET)
    users = shakespeare.users(speeches if speeches is not None else shakespeare.load_speeches())
    try:
        split = make_split(DATASET, {u: sum(map(len, s)) for u, s in users.items()}, params.split_rule())
    except ValueError as exc:
        raise ParameterError(f"the user split parameters (test_users, test_min_words, validation_*) ask too much: {exc}") from exc
    crowd = _crowd(users, split.crowd, params.crowd_max_words, streams.rng(params.seed, "crowd"))
    vocab = Vocabulary.from_sentences(crowd, params.vocab_size)
    crowd_samples = build_samples(crowd, vocab, params.context_words)
    log(f"users: {len(split.crowd)} crowd, {len(split.validation)} validation, {len(split.test)} test; "
        f"crowd text {sum(map(len, crowd))} words -> {len(crowd_samples)} samples; vocabulary {vocab.size}")
    return Corpus(manifest, users, split, crowd, vocab, crowd_samples, params.context_words)


def model_config(params: DeepTypeParams, corpus: Corpus) -> lstm_lm.LSTMConfig:
    return lstm_lm.LSTMConfig(corpus.vocab.input_size, corpus.vocab.size, params.embedding_dim,
                              params.hidden_units, params.lstm_layers)


def build_model(params: DeepTypeParams, corpus: Corpus, seed: int):
    return lstm_lm.build(model_config(params, corpus), seed=streams.tf_seed(seed, "init/global"))


def model_card(model) -> dict:
    """Parameter count and float32 size, the numbers DeepType's Table 2 reports per model."""
    params = int(sum(np.prod(w.shape) for w in model.weights))
    return {"parameters": params, "size_mb": params * 4 / 1e6,
            "layers": [{"layer": l.name, "type": type(l).__name__, "parameters": l.count_params()} for l in model.layers]}


def global_model(params: DeepTypeParams, corpus: Corpus, seed: int, log=print) -> model_cache.Entry:
    """The global model of one seed, trained on the crowd (batch 128), from the cache if it exists."""
    def train():
        model = build_model(params, corpus, seed)
        trainer = Trainer(model, NextWordTask(params.k), params.global_learning_rate, params.optimizer)
        history = trainer.fit(corpus.crowd_samples, params.global_epochs, params.global_batch_size,
                              streams.rng(seed, "batches/global"), log, f"global (seed {seed})")
        return model.get_weights(), {"history": history}

    fields = {name: getattr(params, name) for name in GLOBAL_FIELDS}
    fields.update(seed=seed, k=params.k)
    # the crowd's samples themselves (text, vocabulary, split), and the code of the training loop
    data = [a.sha256 for a in corpus.manifest.artifacts] + [corpus.crowd_samples.digest()]
    code = model_cache.code_digest([f for m in TRAINING_CODE for f in provenance.module_files(m)],
                                   extra=inspect.getsource(global_model))
    return model_cache.load_or_train("deeptype_global", fields, data, code, train, log)


@dataclass
class GlobalModels:
    """One trained global model per seed (from the model cache or trained now) and the Keras
    model whose weights are swapped in per seed."""

    model: object
    weights: dict[int, list[np.ndarray]]
    entries: dict[int, model_cache.Entry]

    @property
    def from_cache(self) -> dict[int, bool]:
        return {s: e.hit for s, e in self.entries.items()}

    def history(self) -> pd.DataFrame:
        return pd.DataFrame([{"phase": "global", "seed": s, "user": "", **h}
                             for s, e in self.entries.items() for h in e.info["history"]])

    def cache(self) -> pd.DataFrame:
        return pd.DataFrame([{"seed": s, "from_cache": e.hit, "train_seconds": e.info["train_seconds"],
                              "key": e.key[:16]} for s, e in self.entries.items()])


def train_global(params: DeepTypeParams, corpus: Corpus, log=print) -> GlobalModels:
    """The global model of every seed, trained on the crowd once per machine (model cache)."""
    seed_everything(params.seed)
    entries = {s: global_model(params, corpus, s, log) for s in params.seed_list}
    return GlobalModels(build_model(params, corpus, params.seed), {s: e.weights for s, e in entries.items()}, entries)
