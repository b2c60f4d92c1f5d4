"""AutLearn A3 (data augmentation) and A4 (online learning), Sec. 3.4 and Sec. 5 after Fig. 7.

A3. AutLearn's on-device step (`protocol.PersonalTrainer`) with and without augmentation of the
user's training part, scored on the test part. Text: EDA (`techniques.eda`, WordNet 3.0 synonyms);
images: crop, rotation and translation (`techniques.image_augment`). Up to `eda_n_aug` /
`image_n_aug` generated per original, capped at `augment_cap` x the original count (the paper: "at
most 1x"). Paper: +0.9% (LSTM), +3.1% (MobileNet); MobileNet's change taken apart: `augment_ablation`.

A4. Online learning emulated as the paper describes it (`protocol.stream_pass`): a user's data in
order (training part, then test part), each sample predicted (and scored), then buffered; each full
buffer of `online_batch_size` trains the last layer once from the inference's cached features.
Against the same start model without updates. Paper: +5.9% (LSTM), +3.1% (MobileNet), larger later.
Text starts from the LSTM pre-trained on Sent140. Images: the public MobileNet's fresh head is at
chance, so, as AutLearn's cloud pre-trains on public data (Sec. 3.1), the head trains on "public"
writers (`image_public_fraction`); the online update (`online_image_candidates`) is chosen on its
own validation writers by online's gain, never on streaming users.

Top-1 throughout (text: the next word before any character is typed; `<unk>` never counts as right);
effects: relative changes of the mean over users, paired bootstrap interval, absolute change beside.
Stages, one per notebook section: `load`, `pretrain`, `choose_rates`, `augment_text`, `augment_images`,
`augment_ablation.run`, `online_text`, `online_images`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data import femnist, wordnet
from ondevice.data.typing_samples import build_samples
from ondevice.papers.autlearn import augment_ablation, common, protocol, report
from ondevice.papers.autlearn.report import plot_augmentation, plot_curve  # noqa: F401  (the notebook's figures)
from ondevice.papers.autlearn.techniques import eda, image_augment
from ondevice.papers.deeptype.techniques.inference_reuse import OnlineTrainer
from ondevice.report import claims, facts, record
from ondevice.training import selection

NAME = "autlearn_augment_online"
MODELS = common.MODEL_NAMES
PAPER = facts.paper(NAME)
# (technique, kind, part) -> the claim and the paper's quantity it is judged against (None: "larger later", no number)
ONLINE = "online learning raises {} accuracy"
CLAIMS = {
    (technique, kind, part): (claim.format(MODELS[kind]), quantity and quantity.format(MODELS[kind]))
    for technique, part, claim, quantity in (
        ("augmentation", "test", "augmentation raises {} accuracy", "augmentation gain, {}"),
        ("online", "stream", ONLINE + " over the stream", "online learning gain over the stream, {}"),
        ("online", "last", ONLINE + " on the last part of the stream", None),
    )
    for kind in MODELS
}
# The paper's data sets, smaller or re-derived (not the Shakespeare manifest's DeepType stand-in).
STAND_IN = (
    "the paper's full data sets: LEAF Sent140 for pre-training (the mirror holds its 8,692-tweet test "
    "split only), LEAF FEMNIST (105 writers, a 5% sample) and LEAF's Shakespeare users (here the suite's "
    "own reading of the same Project Gutenberg plays)"
)
ONLINE_IMAGE_CANDIDATES = tuple(f"sgd:{r}" for r in ("0.001", "0.003", "0.01", "0.03", "0.1")) + tuple(
    f"adam:{r}" for r in ("0.0001", "0.0003", "0.001", "0.003")
)


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    # A3: EDA (Wei and Zou's default rates) and image augmentation, capped at 1x (the paper)
    eda_alpha_sr: float = 0.1
    eda_alpha_ri: float = 0.1
    eda_alpha_rs: float = 0.1
    eda_p_rd: float = 0.1
    eda_operations: tuple[str, ...] = eda.OPERATIONS
    eda_n_aug: float = 5.0  # generated per sentence before the cap ("more than 5x", the paper)
    image_operations: tuple[str, ...] = ("crop", "rotation", "translation")  # the paper's MobileNet choice
    image_n_aug: int = 5
    augment_cap: float = 1.0  # generated samples used: at most this x the original count
    ablation_epochs: tuple[int, ...] = (1, 3)  # MobileNet's change taken apart also at these epochs
    # A4
    online_batch_size: int = 16  # the paper's default
    last_fraction: float = 0.25  # "later": the last quarter of each stream (ours are short)
    image_public_fraction: float = 0.5  # writers whose data trains the cloud head (A4 only)
    image_validation_fraction: float = 0.25  # of those, held out to choose the online update
    online_image_candidates: tuple[str, ...] = ONLINE_IMAGE_CANDIDATES  # "optimizer:rate", the more conservative first
    curve_points: int = 10
    bootstrap: int = 2000

    # text_users: 6 at default to fit the CPU budget (A3 trains every user's softmax twice, A4
    # streams every user's data twice). Smoke: two FEMNIST file pairs (10 writers), all used, so that
    # A4 has public, validation and streaming writers; 15 head epochs (cheap on cached features).
    PRESETS = common.presets(
        {
            "smoke": dict(femnist_pairs=2, image_users=0, image_personal_epochs=15, bootstrap=300, curve_points=5),
            "default": dict(text_users=6),
        }
    )

    def check(self) -> None:
        super().check()
        self.between("[0, 1]", "eda_alpha_sr", "eda_alpha_ri", "eda_alpha_rs", "eda_p_rd")
        for name, ops in (("eda_operations", eda.OPERATIONS), ("image_operations", image_augment.OPERATIONS)):
            chosen = getattr(self, name)
            self.require(bool(chosen) and set(chosen) <= set(ops), name, f"must be a non-empty subset of {ops}")
        self.positive("eda_n_aug", "augment_cap")
        self.at_least(1, "image_n_aug", "online_batch_size")
        self.require(all(e >= 1 for e in self.ablation_epochs), "ablation_epochs", "must be epochs >= 1")
        self.between("(0, 1)", "last_fraction", "image_public_fraction", "image_validation_fraction")
        ok = bool(self.online_image_candidates) and all(map(_candidate, self.online_image_candidates))
        self.require(ok, "online_image_candidates", "must list 'sgd:<rate>' or 'adam:<rate>' with positive rates")
        self.at_least(2, "curve_points")
        self.at_least(100, "bootstrap")


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
    text, images = common.load_text(params, log), common.load_images(params, log)
    wn, manifest = wordnet.load()
    log(f"WordNet 3.0: {sum(map(len, wn.index.values())):,} lemma entries")
    return Data(text, images, wn, manifest)


def pretrain(params: Params, data: Data, log=print) -> dict[str, common.Pretrained]:
    """The public pre-trained models (the LSTM from the model cache or trained on Sent140)."""
    text = common.pretrained_text(params, data.text, log)
    return {"text": text, "image": common.pretrained_image(params, data.images, log)}


def choose_rates(params: Params, data: Data, models: dict, log=print) -> tuple[Params, pd.DataFrame]:
    """The on-device rates chosen on the validation users (never the test users)."""
    return protocol.choose_rates(params, data.text, data.images, models, log)


def make_eda(params: Params, data: Data) -> eda.EDA:
    p = params
    return eda.EDA(data.wordnet.synonyms, p.eda_alpha_sr, p.eda_alpha_ri, p.eda_alpha_rs, p.eda_p_rd, p.eda_operations)


def eda_examples(params: Params, data: Data, n: int = 4) -> pd.DataFrame:
    """What EDA makes of a user's first sentences of at least six words: each operation once."""
    made, rng, user = make_eda(params, data), streams.rng(params.seed, "eda/examples"), data.text.users[0]
    ops = {"sr": "synonym replacement", "ri": "random insertion", "rs": "random swap", "rd": "random deletion"}
    picked = [s for s in data.text.train_sentences[user] if len(s) >= 6][:n]
    rows = [(user, name, " ".join(s), " ".join(made.apply(op, s, rng))) for s in picked for op, name in ops.items()]
    return pd.DataFrame(rows, columns=["user", "operation", "original", "augmented"])


def augment_text(params: Params, data: Data, models: dict, log=print) -> pd.DataFrame:
    """Per user: AutLearn's step on the training part without and with EDA; top-1 on the test part."""
    text, made = data.text, make_eda(params, data)

    def augment(user):
        sents, rng = text.train_sentences[user], streams.rng(params.seed, f"eda/{user}")
        more = eda.augment_corpus(made, sents, rng, params.eda_n_aug, params.augment_cap)
        return build_samples(sents + more, text.vocab, text.context_words), len(more)

    return protocol.augmented_steps(params, "text", text, models["text"], augment, "sentences", log)


def augment_images(params: Params, data: Data, models: dict, log=print) -> pd.DataFrame:
    """Per writer: AutLearn's step (the MobileNet head on the writer's LEAF training images) without
    and with crop/rotation/translation; top-1 on the writer's test images."""
    images, augmenter = data.images, image_augment.ImageAugmenter(params.image_operations)
    augment = lambda user: augment_ablation.training_set(params, images, user, augmenter)
    return protocol.augmented_steps(params, "image", images, models["image"], augment, "images", log)


def online_text(params: Params, data: Data, models: dict, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each user's sentences in order (training part, then test part) through the pre-trained LSTM,
    with and without online updates of its softmax."""
    text, pre = data.text, models["text"]
    trainer = protocol.online_trainer(params, "text", pre.model)
    return protocol.online_rows(
        params, "text", trainer, pre.weights, {u: protocol.text_stream(text, u) for u in text.users}, log
    )


def image_split(params: Params, images: common.ImageData) -> dict[str, tuple[str, ...]]:
    """Writers by role, drawn at random from their own stream: "head" and "validation" (public,
    the cloud's) and "users" (the streaming users)."""
    order = streams.rng(params.seed, "autlearn/public-writers").permutation(len(images.users))
    n_public = max(2, min(len(order) - 2, round(params.image_public_fraction * len(order))))
    n_val = max(1, min(n_public - 1, round(params.image_validation_fraction * n_public)))
    pick = lambda idx: tuple(sorted(images.users[i] for i in idx))
    return {"head": pick(order[n_val:n_public]), "validation": pick(order[:n_val]), "users": pick(order[n_public:])}


def online_images(params: Params, data: Data, models: dict, log=print):
    """The cloud trains the MobileNet head on its public writers' images and chooses the online
    update on its validation writers; each user's images in LEAF's order (training part, then test
    part) then stream through that head, with and without online updates. Returns the users'
    rows and curve, the selection table and notes."""
    images, pre = data.images, models["image"]
    roles = image_split(params, images)
    pooled = images.pooled(roles["head"], ("train", "test"))
    rng = streams.rng(params.seed, "batches/cloud-head")
    protocol.PersonalTrainer(params, "image", pre.model).fit(pre.weights, pooled, rng)
    start = pre.model.get_weights()
    log(
        f"cloud head trained on {len(roles['head'])} public writers ({len(pooled[1])} images); "
        f"{len(roles['validation'])} validation writers; {len(roles['users'])} streaming users"
    )
    stream = lambda users: {u: protocol.image_stream(*images.pooled([u], ("train", "test"))) for u in users}

    def trainer(candidate: str) -> OnlineTrainer:
        optimizer, rate = _candidate(candidate)
        return protocol.online_trainer(params, "image", pre.model, optimizer, rate)

    def gain(candidate: dict) -> float:
        update, quiet = trainer(candidate["update"]), lambda m: None
        rows, _ = protocol.online_rows(params, "image", update, start, stream(roles["validation"]), quiet)
        wide = rows.pivot(index="user", columns="condition", values="top1_stream")
        return float((wide["online"] - wide["pre-trained"]).mean())

    best, table = selection.select([{"update": c} for c in params.online_image_candidates], gain, log)
    table = table.rename(columns={"score": "validation gain (top-1, absolute)"})
    rows, curve = protocol.online_rows(params, "image", trainer(best["update"]), start, stream(roles["users"]), log)
    notes = dict(public_writers=len(roles["head"]), validation_writers=len(roles["validation"]))
    notes |= dict(public_images=int(len(pooled[1])), streaming_writers=len(roles["users"]))
    notes |= dict(online_image_update=best["update"])
    return rows, curve, table, notes


def effects(params: Params, augmented: pd.DataFrame, online: pd.DataFrame) -> pd.DataFrame:
    """Each claim: paired bootstrap over users of the relative change of the mean top-1."""
    numbers, rows, n_boot = {n.quantity: n.value for n in PAPER.numbers}, [], params.bootstrap
    sources = {
        "augmentation": (augmented, "augmentation", "with", "without"),
        "online": (online, "condition", "online", "pre-trained"),
    }
    for (technique, kind, part), (claim, quantity) in CLAIMS.items():
        table, column, *pair = sources[technique]
        value = "top1" if technique == "augmentation" else f"top1_{part}"
        better, worse = (report.wide(table, value, model=MODELS[kind], **{column: c}) for c in pair)
        rng = streams.rng(params.seed, f"bootstrap/{technique}/{kind}/{part}")
        absolute = {"absolute change of the mean": float(better.mean() - worse.mean())}
        rows.append(report.effect_row(claim, numbers.get(quantity, np.nan), better, worse, rng, n_boot, **absolute))
    return pd.DataFrame(rows)


def conclude(
    params, data, models, examples, augmented, online, curve, image_selection, image_notes, rates, wall_time_s, ablation
) -> record.Result:
    """Tables, headline numbers, the paper's numbers beside ours, the verdicts and the diagnoses."""
    claim = CLAIMS[("augmentation", "image", "test")][0]
    eff = augment_ablation.diagnose(params, effects(params, augmented, online), claim, ablation)
    ours = {q: float(eff.loc[eff.effect == c, "our change"].iloc[0]) for (_, _, part), (c, q) in CLAIMS.items() if q}
    headline = {q: claims.headline([v]) for q, v in ours.items()}
    tables = dict(data=data.table(), eda_examples=examples, augmentation=augmented, online=online, curve=curve)
    tables |= dict(online_image_selection=image_selection, summary=report.augment_online_summary(augmented, online))
    tables |= dict(pretraining=models["text"].history(), paper_vs_ours=claims.paper_vs_ours(PAPER, ours), effects=eff)
    tables |= dict(rate_selection=rates, augmentation_ablation=ablation)
    manifests = [m.summary() for m in (*data.text.manifests, data.images.manifest, data.wordnet_manifest)]
    notes = dict(text_users=list(data.text.users), image_users=list(data.images.users), **image_notes)
    notes |= dict(pretrained_lstm_from_cache=models["text"].from_cache, femnist_classes=femnist.CLASSES)
    notes |= report.rate_notes(params, data.text, data.images)
    return report.result(NAME, params, tables, headline, manifests, STAND_IN, wall_time_s, **notes)


def verdict_text(result: record.Result) -> str:
    return report.larger_later_text(result.tables["effects"], CLAIMS, STAND_IN)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load(params, log)
    models = pretrain(params, data, log)
    params, rates = choose_rates(params, data, models, log)
    examples = eda_examples(params, data)
    text_aug, image_aug = augment_text(params, data, models, log), augment_images(params, data, models, log)
    ablation = augment_ablation.run(params, data.images, models["image"], image_aug, log)
    augmented = pd.concat([text_aug, image_aug])
    t_rows, t_curve = online_text(params, data, models, log)
    i_rows, i_curve, i_selection, notes = online_images(params, data, models, log)
    online, curve = pd.concat([t_rows, i_rows]), pd.concat([t_curve, i_curve])
    wall = time.perf_counter() - start
    return conclude(params, data, models, examples, augmented, online, curve, i_selection, notes, rates, wall, ablation)
