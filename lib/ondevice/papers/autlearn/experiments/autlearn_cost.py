"""AutLearn A5 (Fig. 8) and A6 (Fig. 9): what on-device training costs, and what AutLearn's
optimisations save: compression, a compiler, the inference cache, and energy under governors.

Every cost is a ratio measured in one run, baseline and technique side by side, per personal
epoch of AutLearn's on-device step (the last layer trains; every step runs the whole forward
pass, as on the paper's phones), batch 16 for the LSTM and 1 and 16 for MobileNet:

- Compression (cloud side, `compression.compress`; MobileNet re-trained on the cloud's images first): the
  paper's structured pruning searched to `max_accuracy_drop` of held-out accuracy (re-training: `retraining`);
  DeepType's SVD of the softmax, re-trained, at the smallest rank inside the budget (`techniques/svd_rank.py`);
  our ablation, not compared with the paper's number: tensorflow-model-optimization's magnitude pruning.
  Work removed, accuracy lost, time saved (`compression.summary`); why a compression's time does not
  follow its work (`step_profile`, and the same compressions at the paper's sizes, `paper_size`).
- Compiler (`techniques/compiler.py`): the TensorFlow step (`tf.function`), the same step compiled
  by XLA (`jit_compile`) and the trainable TFLite file's `train` signature. The paper extended TVM
  with gradient operators and tuned it per phone; XLA and TFLite stand in for it here.
- Online learning with and without DeepType's inference cache (`inference_reuse`). Phones: the LSTM's epoch
  extrapolated to the Redmi Note 8 and Nexus 6 from FLASH's measured per-layer times (`device/availability.py`).
- Energy (A6): the modelled meter of `device/energy` (the Nexus 6 power profile x busy time),
  un-optimised vs optimised (pruned, and XLA-compiled when times are measured) under the
  `performance` and `powersave` governors, normalised to un-optimised on `performance`.

Time is measured (steady-state step time after warm-up x steps, `time_source = "measured"`) or, where a run
must reproduce bit for bit (smoke: the suite diffs a run against its re-run), counted: FLOPs from the layer
shapes (`time_source = "counted"`); the compiler can only be measured ("time" in its column names).

The compression is `compression`'s, the timing and counting `costs`'. Stages, one per notebook
section: `load`, `compress`, `time_epochs`, `compiler`, `online`, `phones`, `energy`,
`step_profile.profile`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.device import availability
from ondevice.device.energy import profiles
from ondevice.device.energy.base import MODELLED
from ondevice.device.energy.modelled import GovernorModel
from ondevice.papers.autlearn import common, compression, costs, report, step_profile
from ondevice.papers.autlearn.compression import Compressed
from ondevice.papers.autlearn.costs import compiler, first_step_losses, online, time_epochs
from ondevice.papers.autlearn.techniques.compiler import PATHS
from ondevice.report import claims, facts, record
from ondevice.report.conclusion import Conclusion
from ondevice.training.trainer import seed_everything

NAME = "autlearn_cost"
MODELS = common.MODEL_NAMES
PAPER = facts.paper(NAME)
FLOPS_SECTION = "Counted work beside time"
STAND_IN = (
    "the paper's full data sets and phones: LEAF Sent140's 8,692-tweet test split for the public text, 105 "
    "LEAF FEMNIST writers (a 5% sample; a few of them as the cloud's data in place of ImageNet), the suite's "
    "reading of LEAF's Shakespeare users, and this machine's CPU for the phones (energy modelled from the "
    "Nexus 6 power profile, phone times extrapolated from FLASH's measurements)"
)


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    cost_text_users: int = 4  # personal users timed (drawn from the text users)
    cost_image_users: int = 4  # writers timed (drawn from those not kept as the cloud's data)
    cloud_writers: int = 6  # FEMNIST writers the cloud prunes and re-trains MobileNet with (ImageNet is not here)
    min_holdout_images: int = 1000  # the cloud writers' test images the 1% budget is judged on, at least
    # re-training after compression: Adam at the rate `retraining.choose_rate` picks among these (rule
    # fixed before the run: the highest selection top-1 of the first pruning round's model re-trained once)
    text_retrain_rates: tuple[float, ...] = (0.0002, 0.0006, 0.002)  # 0.002: pre-training's
    image_retrain_rates: tuple[float, ...] = (0.00005, 0.00015, 0.0005)  # 0.0005: CloudTrain's
    retrain_selection_samples: int = 3000  # LSTM: held-out public samples apart from the budget's (0: the rest)
    retrain_selection_fraction: float = 0.1  # MobileNet: cloud writers' training images held out for it
    max_accuracy_drop: float = 0.01  # compress until validation top-1 falls this much (absolute; the paper's 1%)
    prune_step: float = 0.05  # each round's resource budget: this share of the uncompressed model's FLOPs lower
    prune_candidates: int = 0  # MobileNet layers tried per round, those with the most FLOPs (0: all)
    retrain_samples: int = 20000  # public samples per re-training epoch of a pruned LSTM (0: all)
    retrain_epochs: int = 1  # per re-training epoch: passes over its samples
    retrain_max_epochs: int = 10  # a pruning round re-trains to the selection plateau, at most this many epochs
    retrain_patience: int = 2  # epochs without a higher selection top-1 that end the plateau
    adapt_max_epochs: int = 15  # MobileNet re-trains on the cloud's images before compression (retraining.adapt)
    validation_samples: int = 5000  # public held-out samples the LSTM's budget is judged on (0: all)
    cloud_head_epochs: int = 15  # MobileNet: the head fitted on the cloud writers to score a backbone
    svd_fractions: tuple[float, ...] = (0.5, 0.25, 0.125, 0.0625)  # softmax ranks tried (x hidden units), largest first
    svd_retrain_epochs: int = 4  # a cut rank re-trains until inside the budget, at most this many epochs
    sparsities: tuple[float, ...] = (0.5, 0.75, 0.9)  # magnitude pruning tried
    image_batch_sizes: tuple[int, ...] = (1, 16)
    compiler_paths: tuple[str, ...] = PATHS  # tensorflow (the baseline) first; xla, tflite
    timing_steps: int = 30  # steps timed per user and variant (epoch time = mean step x steps)
    warmup_steps: int = 3
    timing_repeats: int = 5  # timed passes per user and variant after the warm-up; the median pass counts
    time_source: str = "measured"  # measured | counted (FLOPs; reproduces bit for bit)
    online_samples: int = 256  # stream samples per user in the online comparison
    online_batch_size: int = 16  # the paper's default update size
    phones: tuple[str, ...] = ("redmi_note8", "nexus6")
    governors: tuple[str, ...] = ("performance", "powersave")  # the baseline first
    device_profile: str = "nexus6"
    compute_bound: float = 1.0
    flops_per_cycle: float = 1.0  # counted time: FLOPs per cycle of the modelled CPU
    bootstrap: int = 2000

    # default: 4 users of each kind; the LSTM's budget judged on 6,000 of Sent140's 11,059 held-out samples
    # (the other 5,059 select), re-training epochs of 10,000; 70 cloud writers (1,091 test images judge
    # MobileNet's budget, a 10% of their training images select, the other 9,512 re-train)
    PRESETS = common.presets(
        {
            "smoke": dict(text_users=3, cost_text_users=3, cost_image_users=3, cloud_writers=3, image_users=6)
            | dict(prune_step=0.2, prune_candidates=2, retrain_samples=500, validation_samples=500)
            | dict(retrain_max_epochs=2, retrain_patience=1, adapt_max_epochs=2)
            | dict(cloud_head_epochs=3, svd_fractions=(0.25,), svd_retrain_epochs=2, sparsities=(0.5,), timing_steps=3)
            | dict(warmup_steps=1, timing_repeats=1, min_holdout_images=0, retrain_selection_samples=500)
            | dict(text_retrain_rates=(0.0006, 0.002), image_retrain_rates=(0.00015, 0.0005))
            | dict(compiler_paths=("tensorflow", "xla"), time_source="counted", online_samples=64, bootstrap=300),
            "default": dict(text_users=4, image_users=0, cloud_writers=70, prune_candidates=3, cloud_head_epochs=8)
            | dict(validation_samples=6000, retrain_selection_samples=0, retrain_samples=10000)
            | dict(sparsities=(0.5, 0.8)),
            "paper": dict(cost_text_users=20, cost_image_users=20, cloud_writers=80)
            | dict(retrain_samples=0, timing_steps=100),
        }
    )

    def check(self) -> None:
        super().check()
        self.at_least(2, "cost_text_users", "cost_image_users")  # effects are paired over users
        self.at_least(1, "cloud_writers", "timing_steps", "timing_repeats", "retrain_epochs", "cloud_head_epochs")
        self.at_least(1, "svd_retrain_epochs", "retrain_max_epochs", "retrain_patience", "adapt_max_epochs")
        self.at_least(1, "online_batch_size", "online_samples")
        self.at_least(0, "prune_candidates", "retrain_samples", "validation_samples", "warmup_steps")
        for name in ("text_retrain_rates", "image_retrain_rates"):
            self.require(bool(getattr(self, name)) and min(getattr(self, name)) > 0, name, "must be positive rates")
        self.at_least(0, "retrain_selection_samples")
        self.between("(0, 1)", "retrain_selection_fraction")
        at_most = self.cost_text_users <= (self.text_users or 10**9)
        self.require(at_most, "cost_text_users", "must be at most text_users")
        self.between("[0, 1)", "max_accuracy_drop")
        self.between("(0, 1)", "prune_step")
        self.between("[0, 1]", "compute_bound")
        self.positive("flops_per_cycle")
        self.at_least(100, "bootstrap")
        for name in ("svd_fractions", "sparsities"):
            self.require(all(0 < f < 1 for f in getattr(self, name)), name, "must be in (0, 1)")
        sizes = bool(self.image_batch_sizes) and min(self.image_batch_sizes) >= 1
        self.require(sizes, "image_batch_sizes", "must be positive batch sizes")
        paths = self.compiler_paths
        paths_ok = paths[:1] == ("tensorflow",) and set(paths) <= set(PATHS) and len(set(paths)) == len(paths) > 1
        self.require(paths_ok, "compiler_paths", f"must start with 'tensorflow' and add some of {PATHS[1:]}, each once")
        self.require(self.time_source in ("measured", "counted"), "time_source", "must be 'measured' or 'counted'")
        phones = sorted(availability.PHONES)
        self.require(set(self.phones) <= set(phones), "phones", f"must be among {phones}")
        governors_ok = self.governors[:1] == ("performance",) and len(set(self.governors)) == len(self.governors)
        self.require(governors_ok, "governors", "must start with 'performance' (the baseline) and not repeat")
        devices = sorted(profiles.DEVICES)
        self.require(self.device_profile in devices, "device_profile", f"must be one of {devices}")

    def governor_model(self) -> GovernorModel:
        return GovernorModel(profiles.device(self.device_profile).profile(), compute_bound=self.compute_bound)


@dataclass
class Data:
    text: common.TextData
    images: common.ImageData
    text_users: tuple[str, ...]  # timed
    image_users: tuple[str, ...]  # timed
    cloud_writers: tuple[str, ...]  # the cloud's labelled images for pruning MobileNet
    models: dict[str, common.Pretrained]

    def timed(self, kind: str) -> tuple[tuple[str, ...], dict]:
        """The timed users of a kind and their training parts."""
        return (self.text_users, self.text.train) if kind == "text" else (self.image_users, self.images.train)

    def table(self) -> pd.DataFrame:
        images = lambda users, parts: sum(len(getattr(self.images, p)[u][1]) for u in users for p in parts)
        timed, cloud = images(self.image_users, ["train"]), images(self.cloud_writers, ["train", "test"])
        rows = [
            (
                "LSTM",
                "timed users (Shakespeare)",
                len(self.text_users),
                sum(len(self.text.train[u]) for u in self.text_users),
            ),
            ("LSTM", "cloud: Sent140 held out (pruning's validation)", "", len(self.text.public_holdout)),
            ("MobileNet", "timed writers (FEMNIST)", len(self.image_users), timed),
            ("MobileNet", "cloud: writers kept apart (pruning's data)", len(self.cloud_writers), cloud),
        ]
        return pd.DataFrame(rows, columns=["model", "role", "users", "samples"])


def load(params: Params, log=print) -> Data:
    """The shared AutLearn data and public pre-trained models; the timed users and the cloud's
    writers are drawn from their own streams (the cloud's writers are never timed)."""
    seed_everything(params.seed)
    text, images = common.load_text(params, log), common.load_images(params, log)
    need = params.cloud_writers + params.cost_image_users
    if len(images.users) < need:
        raise ValueError(
            f"parameters 'cloud_writers' + 'cost_image_users' need {need} writers; the data has {len(images.users)}"
        )
    pick = streams.rng(params.seed, "autlearn-cost/text-users").choice(
        len(text.users), params.cost_text_users, replace=False
    )
    order = streams.rng(params.seed, "autlearn-cost/writers").permutation(len(images.users))
    writers = lambda idx: tuple(sorted(images.users[i] for i in idx))
    cloud, timed = writers(order[: params.cloud_writers]), writers(order[params.cloud_writers : need])
    if (held := len(images.pooled(cloud, ("test",))[1])) < params.min_holdout_images:
        raise ValueError(
            f"the cloud writers hold {held} test images; 'min_holdout_images' asks {params.min_holdout_images}"
        )
    models = {"text": common.pretrained_text(params, text, log), "image": common.pretrained_image(params, images, log)}
    return Data(text, images, tuple(sorted(text.users[i] for i in pick)), timed, cloud, models)


def compress(params: Params, data: Data, log=print) -> tuple[dict[str, list[Compressed]], pd.DataFrame]:
    """Per model: the uncompressed public model and each compression within the accuracy budget
    (`compression.compress`), and the structured search's rounds. The LSTM is validated and re-trained
    on public text, MobileNet scored on the cloud's writers."""
    variants, rounds = {}, []
    for kind, pre in data.models.items():
        text, images = (params, data.text), (params, data.images, data.cloud_writers)
        cloud = compression.cloud_text(*text) if kind == "text" else compression.cloud_image(*images)
        variants[kind], kind_rounds = compression.compress(params, kind, pre, cloud, log)
        rounds += kind_rounds
    return variants, pd.DataFrame(rounds)


def energy(params: Params, epochs: pd.DataFrame, compiled: pd.DataFrame) -> pd.DataFrame:
    """Modelled energy of each timed user's LSTM epoch (`costs.modelled_energy`), un-optimised
    (uncompressed, TensorFlow) and optimised (structured pruning; with measured time also the
    XLA/TensorFlow time ratio of the user's uncompressed epoch, the compiler's saving), under each
    governor, normalised to the user's un-optimised epoch on `performance`."""
    lstm = epochs[epochs.model == "LSTM"].set_index(["user", "method"]).epoch_seconds
    with_xla = params.time_source == "measured" and "xla" in params.compiler_paths
    busy = {}
    for user in sorted(set(epochs[epochs.model == "LSTM"].user)):
        busy[user] = {"un-optimised": lstm[(user, "uncompressed")], "optimised": lstm[(user, "structured pruning")]}
        if with_xla:
            c = compiled[(compiled.model == "LSTM") & (compiled.user == user)].set_index("path").epoch_time_seconds
            busy[user]["optimised"] *= min(1.0, c["xla"] / c["tensorflow"])
    return costs.modelled_energy(params, busy)


def conclude(
    params, data, variants, rounds, epochs, compiled, parity, online_table, phones, energy_table, profile, wall
) -> record.Result:
    """Tables, the paper's ratios beside ours (medians over users, relative to each quantity's
    baseline) and paired verdicts. With measured time a compression's diagnosis is its step's profile
    (`step_profile`); counted time follows the count, and the FLOP line stays. `phones`: the phone
    times and the fits' quality (`costs.phones`)."""
    measured = report.cost_quantities(epochs, online_table, energy_table)
    baseline = {e.worse: e.better for e in PAPER.effects}
    ratio = lambda q: float(np.median(measured[q]) / np.median(measured[baseline.get(q, q)]))
    c = Conclusion(NAME, params, PAPER)
    pairs = {e.claim: (measured[e.better], measured[e.worse]) for e in PAPER.effects}
    flops = report.flops_beside_time(PAPER, report.flop_quantities(epochs, online_table))
    # open: the work removed is our models' and our techniques', so a shortfall stays ours
    why = {r.effect: claims.Diagnosis(report.flop_diagnosis(r), FLOPS_SECTION) for _, r in flops.iterrows()}
    if params.time_source == "measured":
        why |= profile.diagnoses(flops)
    repeats = params.timing_repeats if params.time_source == "measured" else None  # each user's median pass
    rng = streams.rng(params.seed, "bootstrap")
    effects = c.effects(pairs, rng, n_boot=params.bootstrap, diagnoses=why, repeats=repeats)
    flops.insert(2, "time change (ours)", effects["our change"].to_numpy())
    c.headlines({f"{e.claim}: change": [change] for e, change in zip(PAPER.effects, effects["our change"])})
    numbers = c.paper_vs_ours({n.quantity: ratio(n.quantity) for n in PAPER.numbers})
    source = "counted FLOPs" if params.time_source == "counted" else "measured time on this machine"
    numbers["ours from"] = [("modelled energy: " if q.startswith("energy") else "") + source for q in numbers.quantity]
    comp = report.compression_table(variants)
    tables = dict(compression=comp, pruning_rounds=rounds, svd_ranks=compression.svd_ranks(variants), epochs=epochs)
    tables |= dict(zip(("retrain_rates", "retrain_control"), compression.retrain_control(variants)))
    tables["adaptation"] = compression.adaptation(variants)
    tables |= dict(compression_summary=compression.summary(comp, epochs), **profile.tables())
    tables |= dict(compiler_time=compiled, compiler_time_effects=report.compiler_effects(params, compiled))
    tables |= dict(compiler_parity=parity, online=online_table, phone_times=phones[0], layer_time_fit=phones[1])
    tables |= dict(energy=energy_table, governor_claims=report.governor_claims(params, energy_table))
    tables |= dict(flops_beside_time=flops)
    manifests = [m.summary() for m in (*data.text.manifests, data.images.manifest)]
    notes = dict(time_source=params.time_source, energy_label=MODELLED, timed_text_users=list(data.text_users))
    notes |= dict(timed_writers=list(data.image_users), cloud_writers=list(data.cloud_writers))
    notes |= dict(compiler_stand_in="XLA (jit_compile) and the TFLite train signature stand in for extended TVM")
    notes |= dict(phone_times="extrapolated from FLASH's per-layer DL4J measurements")
    return c.result(tables, manifests, STAND_IN, wall, **notes)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load(params, log)
    variants, rounds = compress(params, data, log)
    epochs = time_epochs(params, data, variants, log)
    compiled = compiler(params, data, variants, log)
    parity = first_step_losses(params, data, variants)
    online_table = online(params, data, variants, log)
    phones = costs.phones(params, data, variants, log)
    energy_table = energy(params, epochs, compiled)
    profile = step_profile.profile(params, data, variants, log)
    tables = (rounds, epochs, compiled, parity, online_table, phones, energy_table, profile)
    return conclude(params, data, variants, *tables, time.perf_counter() - start)
