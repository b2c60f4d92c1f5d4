"""AutLearn A3 (data augmentation) and A4 (online learning), Sec. 3.4 and Sec. 5 after Fig. 7.

A3. AutLearn's on-device step (the public pre-trained model, last layer trained on the user's
training part; `autlearn_common.PersonalTrainer`) with and without augmentation of that training
part, scored on the user's test part. Text: EDA (`techniques.autlearn.eda`, synonyms from WordNet
3.0); images: crop, rotation and translation (`techniques.autlearn.image_augment`). Generated
samples are drawn from up to `eda_n_aug` / `image_n_aug` per original and capped at
`augment_cap` x the original count (the paper: "at most 1x"). Paper: +0.9% (LSTM), +3.1% (MobileNet).

A4. Online learning emulated as the paper describes it: a user's data in order (text: the
earlier sentences, then the later ones; images: LEAF's training then test images), every sample
first predicted (that prediction is scored), then buffered; each full buffer of
`online_batch_size` trains the last layer once from the inference's cached features
(`techniques.deeptype.inference_reuse`, DeepType's online path), so later samples meet a model
that learnt from earlier ones. Against the same start model predicting the whole stream without
updates. Paper: +5.9% (LSTM), +3.1% (MobileNet) over the stream, larger later.
- Text starts from the LSTM pre-trained on public Sent140.
- Images: the public pre-trained MobileNet has a fresh 62-class head (chance accuracy), against
  which any learning looks large. AutLearn's cloud pre-trains on public data resembling the users'
  (Sec. 3.1), so here the cloud trains the head on "public" writers, a random
  `image_public_fraction` of the writers read, and the rest are the streaming users.
- The on-device step's rates (A3 for both models, A4's text updates) are chosen on the shared
  validation users (`autlearn_common.choose_rates`), as in the accuracy notebook.
- The update's optimizer and rate: text uses the shared on-device protocol (SGD on the softmax,
  the chosen rate). The MobileNet head's protocol (Adam over 15 epochs from a fresh
  head) is a recipe for many passes, not for single-pass refinement of a trained head, so the
  cloud chooses the online update among `online_image_candidates` on its own validation writers
  (a `image_validation_fraction` of the public writers, left out of the head's training), by the
  gain of online over no updates on their streams: never on the streaming users.

Top-1 accuracy throughout (text: the next word before any character is typed, samples with a
previous word; `<unk>` never counts as right). The paper does not say whether its "%" is absolute
or relative: effects are relative changes of the mean over users with a paired bootstrap interval
(verdicts; means, not medians, because a writer's accuracy on about 15 test images is coarse), and
the effects table gives the absolute change too.

Stages, one per notebook section: `load`, `pretrain`, `choose_rates`, `augment_text`, `augment_images`,
`online_text`, `online_images`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data import femnist, wordnet
from ondevice.data.typing_samples import build_samples
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.techniques import eda as eda_ops
from ondevice.papers.autlearn.techniques import image_augment
from ondevice.papers.autlearn.techniques.eda import EDA, augment_corpus
from ondevice.papers.autlearn.techniques.image_augment import ImageAugmenter
from ondevice.papers.autlearn.techniques.image_augment import augment_images as augment_image_set
from ondevice.papers.deeptype.techniques.inference_reuse import OnlineTrainer
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask, position_scores
from ondevice.training import selection

NAME = "autlearn_augment_online"
MODELS = common.MODEL_NAMES

PAPER = claims.Paper(
    citation="Xu et al., AutLearn (Journal of Software, in Chinese), Sec. 5: data augmentation and online learning",
    numbers=(
        claims.PaperNumber("augmentation gain, LSTM", 0.009, "Sec. 5: +0.9% accuracy (word prediction)"),
        claims.PaperNumber("augmentation gain, MobileNet", 0.031, "Sec. 5: +3.1% accuracy (image classification)"),
        claims.PaperNumber("online learning gain over the stream, LSTM", 0.059, "Sec. 5: +5.9% on all data"),
        claims.PaperNumber("online learning gain over the stream, MobileNet", 0.031, "Sec. 5: +3.1% on all data"),
    ),
    effects=(),
)
# (technique, kind, part) -> the claim and the paper's change (None: "larger later", no number)
CLAIMS = {
    ("augmentation", "text", "test"): ("augmentation raises LSTM accuracy", 0.009),
    ("augmentation", "image", "test"): ("augmentation raises MobileNet accuracy", 0.031),
    ("online", "text", "stream"): ("online learning raises LSTM accuracy over the stream", 0.059),
    ("online", "image", "stream"): ("online learning raises MobileNet accuracy over the stream", 0.031),
    ("online", "text", "last"): ("online learning raises LSTM accuracy on the last part of the stream", None),
    ("online", "image", "last"): ("online learning raises MobileNet accuracy on the last part of the stream", None),
}
NUMBER_OF = {
    ("augmentation", "text"): "augmentation gain, LSTM",
    ("augmentation", "image"): "augmentation gain, MobileNet",
    ("online", "text"): "online learning gain over the stream, LSTM",
    ("online", "image"): "online learning gain over the stream, MobileNet",
}


# The paper's data sets, but smaller or re-derived (the Shakespeare manifest also names what it
# stands in for in DeepType, which does not apply here).
STAND_IN = (
    "the paper's full data sets: LEAF Sent140 for pre-training (the mirror holds its 8,692-tweet test "
    "split only), LEAF FEMNIST (105 writers, a 5% sample) and LEAF's Shakespeare users (here the suite's "
    "own reading of the same Project Gutenberg plays)"
)


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    # A3: EDA (Wei and Zou's default rates) and image augmentation, capped at 1x (the paper)
    eda_alpha_sr: float = 0.1
    eda_alpha_ri: float = 0.1
    eda_alpha_rs: float = 0.1
    eda_p_rd: float = 0.1
    eda_operations: tuple[str, ...] = ("sr", "ri", "rs", "rd")
    eda_n_aug: float = 5.0  # generated per sentence before the cap ("more than 5x", the paper)
    image_operations: tuple[str, ...] = ("crop", "rotation", "translation")  # the paper's MobileNet choice
    image_n_aug: int = 5
    augment_cap: float = 1.0  # generated samples used: at most this x the original count
    # A4
    online_batch_size: int = 16  # the paper's default
    last_fraction: float = 0.25  # "later": the last quarter of each stream (ours are short)
    image_public_fraction: float = 0.5  # writers whose data trains the cloud head (A4 only)
    image_validation_fraction: float = 0.25  # of those, held out to choose the online update
    # online update of the MobileNet head, "optimizer:rate" candidates (the more conservative first)
    online_image_candidates: tuple[str, ...] = (
        "sgd:0.001",
        "sgd:0.003",
        "sgd:0.01",
        "sgd:0.03",
        "sgd:0.1",
        "adam:0.0001",
        "adam:0.0003",
        "adam:0.001",
        "adam:0.003",
    )
    curve_points: int = 10
    bootstrap: int = 2000

    # text_users: 6 at default (not the shared 20) to fit the CPU budget: A3 trains every user's
    # softmax twice (3 epochs, once on 2x the data) and A4 streams every user's data twice.
    # Smoke: two FEMNIST file pairs (10 writers), all used, so that A4 has public, validation and
    # streaming writers; 15 head epochs (cheap: the head trains on cached features).
    PRESETS = common.presets(
        {
            "smoke": dict(femnist_pairs=2, image_users=0, image_personal_epochs=15, bootstrap=300, curve_points=5),
            "default": dict(text_users=6),
        }
    )

    def check(self) -> None:
        super().check()
        for name in ("eda_alpha_sr", "eda_alpha_ri", "eda_alpha_rs", "eda_p_rd"):
            self.require(0 <= getattr(self, name) <= 1, name, "must be in [0, 1]")
        self.require(
            bool(self.eda_operations) and set(self.eda_operations) <= set(eda_ops.OPERATIONS),
            "eda_operations",
            f"must be a non-empty subset of {eda_ops.OPERATIONS}",
        )
        self.require(
            bool(self.image_operations) and set(self.image_operations) <= set(image_augment.OPERATIONS),
            "image_operations",
            f"must be a non-empty subset of {image_augment.OPERATIONS}",
        )
        self.require(self.eda_n_aug > 0, "eda_n_aug", "must be positive")
        self.require(self.image_n_aug >= 1, "image_n_aug", "must be at least 1")
        self.require(self.augment_cap > 0, "augment_cap", "must be positive")
        self.require(self.online_batch_size >= 1, "online_batch_size", "must be at least 1")
        self.require(0 < self.last_fraction < 1, "last_fraction", "must be in (0, 1)")
        self.require(0 < self.image_public_fraction < 1, "image_public_fraction", "must be in (0, 1)")
        self.require(0 < self.image_validation_fraction < 1, "image_validation_fraction", "must be in (0, 1)")
        self.require(
            bool(self.online_image_candidates) and all(_candidate(c) for c in self.online_image_candidates),
            "online_image_candidates",
            "must list 'sgd:<rate>' or 'adam:<rate>' with positive rates",
        )
        self.require(self.curve_points >= 2, "curve_points", "must be at least 2")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def _candidate(text: str) -> tuple[str, float] | None:
    """'sgd:0.01' -> ('sgd', 0.01); None when malformed."""
    name, _, rate = text.partition(":")
    try:
        value = float(rate)
    except ValueError:
        return None
    return (name, value) if name in ("sgd", "adam") and value > 0 else None


@dataclass
class Data:
    text: common.TextData
    images: common.ImageData
    wordnet: wordnet.WordNet
    wordnet_manifest: object

    def table(self) -> pd.DataFrame:
        """The text and image data tables of the shared layer, one below the other."""
        return pd.concat([self.text.table(), self.images.table()], ignore_index=True)


def load(params: Params, log=print) -> Data:
    """The shared AutLearn data (public Sent140, Shakespeare users, FEMNIST writers) and WordNet."""
    text = common.load_text(params, log)
    images = common.load_images(params, log)
    wn, manifest = wordnet.load()
    log(f"WordNet 3.0: {sum(map(len, wn.index.values())):,} lemma entries")
    return Data(text, images, wn, manifest)


def pretrain(params: Params, data: Data, log=print) -> dict[str, common.Pretrained]:
    """The public pre-trained models (the LSTM from the model cache or trained on Sent140)."""
    return {
        "text": common.pretrained_text(params, data.text, log),
        "image": common.pretrained_image(params, data.images, log),
    }


def choose_rates(params: Params, data: Data, models: dict, log=print) -> tuple[Params, pd.DataFrame]:
    """The on-device rates chosen on the validation users (never the test users)."""
    return common.choose_rates(params, data.text, data.images, models, log)


# ---- A3 ---------------------------------------------------------------------------------------


def make_eda(params: Params, data: Data) -> EDA:
    return EDA(
        data.wordnet.synonyms,
        params.eda_alpha_sr,
        params.eda_alpha_ri,
        params.eda_alpha_rs,
        params.eda_p_rd,
        params.eda_operations,
    )


def eda_examples(params: Params, data: Data, n: int = 4) -> pd.DataFrame:
    """What EDA makes of a user's first sentences of at least six words: each operation once."""
    eda, rng = make_eda(params, data), streams.rng(params.seed, "eda/examples")
    user = data.text.users[0]
    picked = [s for s in data.text.train_sentences[user] if len(s) >= 6][:n]
    rows = []
    for s in picked:
        made = {
            "synonym replacement": eda.synonym_replacement(s, max(1, int(params.eda_alpha_sr * len(s))), rng),
            "random insertion": eda.random_insertion(s, max(1, int(params.eda_alpha_ri * len(s))), rng),
            "random swap": eda.random_swap(s, max(1, int(params.eda_alpha_rs * len(s))), rng),
            "random deletion": eda.random_deletion(s, params.eda_p_rd, rng),
        }
        rows += [
            {"user": user, "operation": op, "original": " ".join(s), "augmented": " ".join(out)}
            for op, out in made.items()
        ]
    return pd.DataFrame(rows)


def augment_text(params: Params, data: Data, models: dict, log=print) -> pd.DataFrame:
    """Per user: AutLearn's step on the training part without and with EDA; top-1 on the test part."""
    text, pre = data.text, models["text"]
    step, eda = common.PersonalTrainer(params, "text", pre.model), make_eda(params, data)
    rows = []
    for n, user in enumerate(text.users, 1):
        made = augment_corpus(
            eda,
            text.train_sentences[user],
            streams.rng(params.seed, f"eda/{user}"),
            params.eda_n_aug,
            params.augment_cap,
        )
        sets = {
            "without": text.train[user],
            "with": build_samples(text.train_sentences[user] + made, text.vocab, text.context_words),
        }
        for condition, train in sets.items():
            step.fit(pre.weights, train, streams.rng(params.seed, f"personal/{user}"))
            s = common.score_text(step.model, text.test[user], params.k)
            rows.append(
                {
                    "model": "LSTM",
                    "user": user,
                    "augmentation": condition,
                    "train_samples": len(train),
                    "generated_sentences": len(made) if condition == "with" else 0,
                    "original_sentences": len(text.train_sentences[user]),
                    "test_samples": len(text.test[user]),
                    "top1": s["top1"],
                    "top_k_eff": s["top_k_eff"],
                }
            )
        log(
            f"LSTM user {n}/{len(text.users)} {user}: top-1 {rows[-2]['top1']:.4f} -> {rows[-1]['top1']:.4f} with EDA "
            f"({len(made)} generated sentences for {len(text.train_sentences[user])})"
        )
    return pd.DataFrame(rows)


def augment_images(params: Params, data: Data, models: dict, log=print) -> pd.DataFrame:
    """Per writer: AutLearn's step (the MobileNet head on the writer's LEAF training images) without
    and with crop/rotation/translation; top-1 on the writer's test images."""
    images, pre = data.images, models["image"]
    step, aug = common.PersonalTrainer(params, "image", pre.model), ImageAugmenter(params.image_operations)
    rows = []
    for user in images.users:
        x, y = images.train[user]
        gx, gy = augment_image_set(
            aug, x, y, streams.rng(params.seed, f"image-augment/{user}"), params.image_n_aug, params.augment_cap
        )
        for condition, train in (("without", (x, y)), ("with", (np.concatenate([x, gx]), np.concatenate([y, gy])))):
            step.fit(pre.weights, train, streams.rng(params.seed, f"personal/{user}"))
            s = common.score_image(step.model, images.test[user])
            rows.append(
                {
                    "model": "MobileNet",
                    "user": user,
                    "augmentation": condition,
                    "train_samples": len(train[1]),
                    "generated_images": len(gy) if condition == "with" else 0,
                    "original_images": len(y),
                    "test_samples": len(images.test[user][1]),
                    "top1": s["top1"],
                }
            )
    out = pd.DataFrame(rows)
    means = out.groupby("augmentation").top1.mean()
    log(
        f"MobileNet, {len(images.users)} writers: mean top-1 {means['without']:.4f} -> "
        f"{means['with']:.4f} with augmentation"
    )
    return out


# ---- A4 ---------------------------------------------------------------------------------------


def stream_pass(
    trainer: OnlineTrainer, start: list[np.ndarray], n: int, batch, hits, batch_size: int, train: bool
) -> tuple[np.ndarray, int]:
    """Predict every sample of a stream of n in order with the model of that moment: `batch(idx)`
    gives (inputs, labels), `hits(logits, idx, labels)` 1/0 per sample (NaN: not scored). With
    `train`, each full buffer of `batch_size` then trains the last layer from the cached features
    (a last partial buffer is not trained on). Returns the hits and the updates made."""
    trainer.reset(start)
    b = batch_size if train else max(batch_size, 256)  # no updates: the same predictions, faster
    out, steps = np.full(n, np.nan), 0
    for first in range(0, n, b):
        idx = np.arange(first, min(first + b, n))
        x, y = batch(idx)
        cached = trainer.infer_and_cache(x)
        out[idx] = hits(cached["logits"].numpy(), idx, y)
        if train and len(idx) == b:
            trainer.train_from_cache(cached["features"], y)
            steps += 1
    return out, steps


def _parts(hit: np.ndarray, last_fraction: float) -> dict[str, float]:
    scored = np.flatnonzero(~np.isnan(hit))
    last = scored[len(scored) - max(1, int(round(last_fraction * len(scored)))) :]
    return {"stream": float(hit[scored].mean()), "last": float(hit[last].mean())}


def _curve(hit: np.ndarray, points: int) -> list[dict]:
    scored = hit[~np.isnan(hit)]
    at = np.unique(np.linspace(0, len(scored), points + 1).round().astype(int)[1:])
    total = np.cumsum(scored)
    return [{"samples": int(p), "fraction": p / len(scored), "cumulative_top1": total[p - 1] / p} for p in at]


def _emulate(
    params: Params, kind: str, trainer: OnlineTrainer, start, streams_: dict, log
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, curve = [], []
    for user, (n, batch, hits) in streams_.items():
        for condition in ("pre-trained", "online"):
            hit, steps = stream_pass(trainer, start, n, batch, hits, params.online_batch_size, condition == "online")
            parts = _parts(hit, params.last_fraction)
            rows.append(
                {
                    "model": MODELS[kind],
                    "user": user,
                    "condition": condition,
                    "stream_samples": n,
                    "scored_samples": int((~np.isnan(hit)).sum()),
                    "updates": steps,
                    **{f"top1_{p}": v for p, v in parts.items()},
                }
            )
            curve += [
                {"model": MODELS[kind], "user": user, "condition": condition, **c}
                for c in _curve(hit, params.curve_points)
            ]
        log(
            f"{MODELS[kind]} {user} ({n} samples): top-1 over the stream {rows[-2]['top1_stream']:.4f} -> "
            f"{rows[-1]['top1_stream']:.4f} online, last part {rows[-2]['top1_last']:.4f} -> "
            f"{rows[-1]['top1_last']:.4f}"
        )
    return pd.DataFrame(rows), pd.DataFrame(curve)


def online_text(params: Params, data: Data, models: dict, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each user's sentences in order (training part, then test part) through the pre-trained LSTM,
    with and without online updates of its softmax."""
    text, pre = data.text, models["text"]
    trainer = OnlineTrainer(
        pre.model,
        NextWordTask(params.k),
        params.text_personal_learning_rate,
        params.text_personal_optimizer,
        head=common.LAST_LAYER["text"],
    )
    one = tf.constant(1)

    def user_stream(user):
        samples = build_samples(text.train_sentences[user] + text.test_sentences[user], text.vocab, text.context_words)

        def hits(logits, idx, y):
            hit = position_scores(tf.constant(logits), tf.constant(y), one)[0].numpy()
            ctx = samples.n_context[idx]
            return np.where(ctx > 0, hit[np.arange(len(idx)), np.maximum(ctx - 1, 0)], np.nan)

        return len(samples), samples.padded, hits

    return _emulate(params, "text", trainer, pre.weights, {u: user_stream(u) for u in text.users}, log)


def image_split(params: Params, images: common.ImageData) -> dict[str, tuple[str, ...]]:
    """Writers by role, drawn at random from their own stream: "head" and "validation" (public,
    the cloud's) and "users" (the streaming users)."""
    order = streams.rng(params.seed, "autlearn/public-writers").permutation(len(images.users))
    n_public = max(2, min(len(order) - 2, round(params.image_public_fraction * len(order))))
    n_val = max(1, min(n_public - 1, round(params.image_validation_fraction * n_public)))
    pick = lambda idx: tuple(sorted(images.users[i] for i in idx))
    return {"head": pick(order[n_val:n_public]), "validation": pick(order[:n_val]), "users": pick(order[n_public:])}


def online_images(
    params: Params, data: Data, models: dict, log=print
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """The cloud trains the MobileNet head on its public writers' images and chooses the online
    update on its validation writers; each user's images in LEAF's order (training part, then test
    part) then stream through that head, with and without online updates. Returns the users'
    rows and curve, the selection table and notes."""
    images, pre = data.images, models["image"]
    roles = image_split(params, images)
    whole = {
        u: (
            np.concatenate([images.train[u][0], images.test[u][0]]),
            np.concatenate([images.train[u][1], images.test[u][1]]),
        )
        for u in images.users
    }
    cloud = common.PersonalTrainer(params, "image", pre.model)
    pooled = tuple(np.concatenate([whole[u][i] for u in roles["head"]]) for i in (0, 1))
    cloud.fit(pre.weights, pooled, streams.rng(params.seed, "batches/cloud-head"))
    start = pre.model.get_weights()
    log(
        f"cloud head trained on {len(roles['head'])} public writers ({len(pooled[1])} images); "
        f"{len(roles['validation'])} validation writers; {len(roles['users'])} streaming users"
    )

    def user_stream(user):
        x, y = whole[user]
        return (
            len(y),
            lambda idx: (x[idx], y[idx]),
            lambda logits, idx, labels: (logits.argmax(1) == labels).astype(float),
        )

    def trainer(candidate: str) -> OnlineTrainer:
        optimizer, rate = _candidate(candidate)
        return OnlineTrainer(pre.model, common.image_task(), rate, optimizer, head=common.LAST_LAYER["image"])

    def gain(candidate: dict) -> float:
        rows, _ = _emulate(
            params,
            "image",
            trainer(candidate["update"]),
            start,
            {u: user_stream(u) for u in roles["validation"]},
            lambda m: None,
        )
        wide = rows.pivot(index="user", columns="condition", values="top1_stream")
        return float((wide["online"] - wide["pre-trained"]).mean())

    best, table = selection.select([{"update": c} for c in params.online_image_candidates], gain, log)
    table = table.rename(columns={"score": "validation gain (top-1, absolute)"})
    rows, curve = _emulate(
        params, "image", trainer(best["update"]), start, {u: user_stream(u) for u in roles["users"]}, log
    )
    notes = {
        "public_writers": len(roles["head"]),
        "validation_writers": len(roles["validation"]),
        "public_images": int(len(pooled[1])),
        "streaming_writers": len(roles["users"]),
        "online_image_update": best["update"],
    }
    return rows, curve, table, notes


# ---- conclusions --------------------------------------------------------------------------------


def _wide(table: pd.DataFrame, column: str, key: str, value: str) -> np.ndarray:
    return table[table[column] == value].set_index("user").sort_index()[key].to_numpy(float)[None, :]


def effects(params: Params, augmented: pd.DataFrame, online: pd.DataFrame) -> pd.DataFrame:
    """Each claim: paired bootstrap over users of the relative change of the mean top-1."""
    rows = []
    for (technique, kind, part), (claim, paper_change) in CLAIMS.items():
        if technique == "augmentation":
            t = augmented[augmented.model == MODELS[kind]]
            better, worse = _wide(t, "augmentation", "top1", "with"), _wide(t, "augmentation", "top1", "without")
        else:
            t = online[online.model == MODELS[kind]]
            better, worse = (
                _wide(t, "condition", f"top1_{part}", "online"),
                _wide(t, "condition", f"top1_{part}", "pre-trained"),
            )
        r = claims.paired_effect(
            better,
            worse,
            streams.rng(params.seed, f"bootstrap/{technique}/{kind}/{part}"),
            n_boot=params.bootstrap,
            statistic="mean",
        )
        rows.append(
            {
                "effect": claim,
                "paper change": paper_change if paper_change is not None else np.nan,
                "our change": r["change"],
                "ci low": r["ci_low"],
                "ci high": r["ci_high"],
                "absolute change of the mean": float(better.mean() - worse.mean()),
                "users": r["users"],
                "seeds": r["seeds"],
                "users improved": r["users_improved"],
                "users worse": r["users_worse"],
                "sign test p": r["sign_test_p"],
                "verdict": r["verdict"],
                "level": 0.95,
            }
        )
    return pd.DataFrame(rows)


def summary(augmented: pd.DataFrame, online: pd.DataFrame) -> pd.DataFrame:
    """Median and mean top-1 per model and condition."""
    a = augmented.groupby(["model", "augmentation"]).top1.agg(["median", "mean", "count"]).reset_index()
    a = a.rename(columns={"augmentation": "condition", "count": "users"}).assign(
        experiment="A3 augmentation", part="test part"
    )
    o = []
    for part in ("stream", "last"):
        g = online.groupby(["model", "condition"])[f"top1_{part}"].agg(["median", "mean", "count"]).reset_index()
        o.append(g.rename(columns={"count": "users"}).assign(experiment="A4 online", part=f"{part}"))
    return pd.concat([a, *o], ignore_index=True)[
        ["experiment", "model", "part", "condition", "users", "median", "mean"]
    ]


def conclude(
    params: Params,
    data: Data,
    models: dict,
    examples: pd.DataFrame,
    augmented: pd.DataFrame,
    online: pd.DataFrame,
    curve: pd.DataFrame,
    image_selection: pd.DataFrame,
    image_notes: dict,
    rates: pd.DataFrame,
    wall_time_s: float,
) -> record.Result:
    """Tables, headline numbers, the paper's numbers beside ours and the verdicts."""
    eff = effects(params, augmented, online)
    ours = {}
    for (technique, kind, part), (claim, _) in CLAIMS.items():
        if (technique, kind) in NUMBER_OF and part in ("test", "stream"):
            ours[NUMBER_OF[(technique, kind)]] = float(eff.loc[eff.effect == claim, "our change"].iloc[0])
    headline = {q: claims.headline([v]) for q, v in ours.items()}
    manifests_ = [*data.text.manifests, data.images.manifest, data.wordnet_manifest]
    tables = {
        "data": data.table(),
        "eda_examples": examples,
        "augmentation": augmented,
        "online": online,
        "curve": curve,
        "online_image_selection": image_selection,
        "summary": summary(augmented, online),
        "pretraining": models["text"].history(),
        "rate_selection": rates,
        "headline": claims.headline_table(headline),
        "paper_vs_ours": claims.paper_vs_ours(PAPER, ours),
        "effects": eff,
    }
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        data=[m.summary() for m in manifests_],
        stand_in_data=STAND_IN,
        wall_time_s=wall_time_s,
        notes={
            "text_users": list(data.text.users),
            "image_users": list(data.images.users),
            **image_notes,
            "pretrained_lstm_from_cache": models["text"].from_cache,
            "femnist_classes": femnist.CLASSES,
            "on_device_rates_chosen": {
                "text": params.text_personal_learning_rate,
                "image": params.image_personal_learning_rate,
            },
            "validation_users": {"text": list(data.text.validation.users), "image": list(data.images.validation.users)},
            "effects_statistic": "mean over users (paired bootstrap)",
        },
    )


def verdict_text(result: record.Result) -> str:
    """The suite's verdict bullets for the claims with a paper number, then the "larger later"
    claims: our last-part change against our whole-stream change (point estimates)."""
    eff = result.tables["effects"]
    lines = [claims.verdict_text(eff[eff["paper change"].notna()], None)]
    for kind in ("text", "image"):
        stream = eff[eff.effect == CLAIMS[("online", kind, "stream")][0]].iloc[0]
        last = eff[eff.effect == CLAIMS[("online", kind, "last")][0]].iloc[0]
        larger = "larger" if last["our change"] > stream["our change"] else "not larger"
        lines.append(
            f"- **{MODELS[kind]}, larger later** (the paper gives no number): on the last part of the streams "
            f"online learning changes top-1 by {claims.percent(last['our change'])} (95% interval "
            f"{claims.percent(last['ci low'])} to {claims.percent(last['ci high'])}, {last['verdict']}), "
            f"{larger} than over the whole stream ({claims.percent(stream['our change'])})."
        )
    lines.append(
        f"- Our data is **stand-in data** for {STAND_IN}. Absolute numbers are not comparable with the "
        "paper's; the direction and size of each effect are."
    )
    return "\n".join(lines)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load(params, log)
    models = pretrain(params, data, log)
    params, rates = choose_rates(params, data, models, log)
    examples = eda_examples(params, data)
    augmented = pd.concat([augment_text(params, data, models, log), augment_images(params, data, models, log)])
    t_rows, t_curve = online_text(params, data, models, log)
    i_rows, i_curve, i_selection, notes = online_images(params, data, models, log)
    return conclude(
        params,
        data,
        models,
        examples,
        augmented,
        pd.concat([t_rows, i_rows]),
        pd.concat([t_curve, i_curve]),
        i_selection,
        notes,
        rates,
        time.perf_counter() - start,
    )


def plot_curve(curve: pd.DataFrame, params: Params):
    """Cumulative top-1 along each stream, with and without online updates (median over users)."""
    import seaborn as sns

    med = curve.assign(at=(curve.fraction * params.curve_points).round() / params.curve_points)
    med = med.groupby(["model", "condition", "at"], as_index=False).cumulative_top1.median()
    grid = sns.relplot(
        data=med,
        x="at",
        y="cumulative_top1",
        hue="condition",
        col="model",
        kind="line",
        marker="o",
        palette=["#8c8c8c", "#d1495b"],
        height=3.4,
        aspect=1.15,
        facet_kws={"sharey": False},
    )
    for ax in grid.axes.flat:
        ax.axvspan(1 - params.last_fraction, 1, color="0.92", zorder=0)
    grid.set_axis_labels("share of the user's stream seen", "cumulative top-1 (median over users)")
    grid.figure.suptitle("Online learning while the user uses the model", y=1.04)
    return grid.figure


def plot_augmentation(augmented: pd.DataFrame):
    """Per user: top-1 with augmentation against without (above the diagonal: augmentation helped)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
    for ax, model in zip(axes, ("LSTM", "MobileNet")):
        t = augmented[augmented.model == model].pivot(index="user", columns="augmentation", values="top1")
        ax.scatter(t["without"], t["with"], s=18, color="#30638e")
        lo, hi = float(np.nanmin(t.to_numpy())), float(np.nanmax(t.to_numpy()))
        ax.plot([lo, hi], [lo, hi], color="0.6", lw=1)
        ax.set(title=model, xlabel="top-1 without augmentation", ylabel="top-1 with augmentation")
    fig.tight_layout()
    return fig
