"""DeepType D7 (Sec. 6.1, "Accuracy Improvement of Online Training"): emulated online training.

Each test user's samples arrive in typing order, starting from a global model (`starts`: the paper's
public Twitter model, ours Sent140's tweets, and the crowd model beside it). The
emulator first infers every sample (the suggestion the user sees, and what is scored), buffers it,
and trains one step each time 16 samples are buffered, so later words are suggested by a model that
learnt from the earlier ones. Without online training the global model suggests every word. Both
are scored on the whole stream, its last part (the paper: the last 10K of 100K samples) and the
user's later lines (D3's test part). The online trainer is the protocol's (`protocol.online_trainer`):
by default DeepType's on-device path, the softmax alone reusing the inference's cached features.
The planted-signal control (`planted`) runs the same emulation on users given a habit at graded doses.

Stages: `starts.load`, `starts.train`, `emulate_starts`, `planted_control`, `conclude`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data.per_user_text import Corpus
from ondevice.data.typing_samples import Samples
from ondevice.metrics import chars_needed, top_k_eff
from ondevice.papers.deeptype import common, planted, protocol, report, starts, step_size
from ondevice.papers.deeptype.common import GlobalModels
from ondevice.params import presets
from ondevice.report import claims, facts
from ondevice.report.conclusion import Conclusion, diagnosed, effect_row, wide
from ondevice.tasks import inference, typing_protocol
from ondevice.tasks.next_word import position_scores

NAME = "deeptype_online"
CONDITIONS = ("global", "online")
ALSO = "online, validation choice"  # the same emulation with the validation users' personal optimizer and rate
SECTION = "Online training with the validation users' choice"
PLANTED_SECTION = "Planted-signal control: would online training see a personal signal if the data had one?"
PARTS = {"stream": "whole stream", "last": "last part of the stream", "later_lines": "later lines"}
PAPER = facts.paper(NAME)
PART_EFFECTS = facts.load("deeptype")[NAME]["part_effects"]


@dataclass(frozen=True)
class Params(starts.Params):
    online_batch_size: int = 16  # the paper trains once 16 samples are buffered
    online_training: str = "fine_tune"  # fine_tune: softmax only, reusing inference (the paper's online path) | full
    last_fraction: float = 0.1  # the stream's last part (the paper: last 10K of 100K samples)
    curve_points: int = 20  # cumulative top-k-eff at this many points of each stream (figure)
    # The shared personalization protocol's step (issue 74; until 2026-12-07 the constant personal rate, SGD
    # 1.0): the step-size reading's rate of the first personal epoch, the stream being one pass, from the
    # start's kept epoch (`step_size`; "continued" fixed before the run, as top3eff's tie gives it). The
    # validation choice keeps its constant rate.
    step_reading: str = step_size.READINGS[0]

    # The model fields are the shared presets', so the global models are the other notebooks' cache entries.
    # Starts (`global_texts`): Sent140 (the paper's public Twitter model; main; 90,744 words + 20,006 held out
    # at default, 12,000 at smoke), the crowd beside it (246,561 words at default). The
    # planted control's gain is online minus global top-k-eff over the whole stream (the paper's +9.5%).
    PRESETS = presets(typing_protocol.PRESETS, planted.PRESETS, {"smoke": dict(curve_points=5), "paper": dict(seeds=3)})

    def check(self) -> None:
        super().check()
        self.at_least(1, "online_batch_size")
        self.at_least(2, "curve_points")
        self.require(self.online_training in ("fine_tune", "full"), "online_training", "must be 'fine_tune' or 'full'")
        self.require(0 < self.last_fraction < 1, "last_fraction", "must be in (0, 1)")
        self.require(self.step_reading in step_size.READINGS, "step_reading", f"must be one of {step_size.READINGS}")


def stream(corpus: Corpus, user: str, train_fraction: float) -> tuple[Samples, int]:
    """A user's samples in typing order (earlier lines, then later lines) and where the later
    lines (D3's test part) begin."""
    parts = corpus.personal(user, train_fraction)
    offsets = np.concatenate([parts[0].offsets[:-1], parts[1].offsets + parts[0].offsets[-1]])
    joined = [
        np.concatenate([getattr(p, f) for p in parts]) for f in ("inputs", "labels", "n_context", "word_len", "target")
    ]
    return Samples(*joined[:2], offsets, *joined[2:]), len(parts[0])


class Emulator:
    """Feeds a stream batch by batch: infer (and score) each buffered batch, then train on it."""

    def __init__(self, params: Params, models: GlobalModels, stepped: bool = True):
        self.params, self.models, self.k = params, models, tf.constant(params.k)
        self.reuse, self.stepped, self._trainers = params.online_training == "fine_tune", stepped, {}

    def also(self) -> "Emulator":
        """The same emulation with the validation users' personal optimizer and (constant) learning rate."""
        return Emulator(protocol.validation_choice(self.params), self.models, stepped=False)

    def rate(self, seed: int) -> float:
        """The online rate from the seed's start: the step-size reading's first personal epoch (or constant)."""
        p = self.params
        kept = step_size.kept_epoch(self.models, seed)
        return step_size.schedule(p, p.step_reading, kept)(1) if self.stepped else p.personal_learning_rate

    def run(self, data: Samples, seed: int, train: bool) -> tuple[np.ndarray, int]:
        """R(x) of every sample, as suggested by the model of that moment, and the steps trained.
        Without training the model never changes, so larger batches give the same suggestions faster."""
        rate = self.rate(seed)
        if rate not in self._trainers:
            p = dataclasses.replace(self.params, personal_learning_rate=rate)
            self._trainers[rate] = protocol.online_trainer(p, self.models.model, common.task(p), self.reuse)
        self.trainer = self._trainers[rate]
        self.trainer.reset(self.models.weights[seed])
        b = self.params.online_batch_size if train else max(self.params.online_batch_size, 256)
        needed, steps = np.zeros(len(data), np.int32), 0
        for start in range(0, len(data), b):
            idx = np.arange(start, min(start + b, len(data)))
            x, y = data.padded(idx)
            out = self.trainer.infer_and_cache(x) if self.reuse else None
            logits = out["logits"] if self.reuse else inference(self.trainer.model)(x)
            hit = position_scores(logits, tf.constant(y), self.k)[0].numpy()
            needed[idx] = chars_needed(hit, data.n_context[idx], data.word_len[idx])
            if train and len(idx) == b:  # a full buffer of `online_batch_size` samples: one update
                if self.reuse:
                    self.trainer.train_from_cache(out["features"], y)
                else:
                    self.trainer.step(x, y)
                steps += 1
        return needed, steps


def _parts(n: int, later_start: int, last_fraction: float) -> dict[str, np.ndarray]:
    last = n - max(1, int(round(n * last_fraction)))
    return {"stream": np.arange(n), "last": np.arange(last, n), "later_lines": np.arange(later_start, n)}


def emulate(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every seed and test user, with and without online training: one row per (seed, user,
    condition) with top-k-eff on each part of the stream, and the cumulative curve."""
    emulator, rows, curve, users = Emulator(params, models), [], [], corpus.split.test
    emulators = {"global": emulator, "online": emulator} | ({ALSO: emulator.also()} if params.also_optimizer else {})
    for seed in models.entries:
        for n_user, user in enumerate(users, 1):
            data, later_start = stream(corpus, user, params.personal_train_fraction)
            parts, n = _parts(len(data), later_start, params.last_fraction), len(data)
            points = np.unique(np.linspace(0, n, params.curve_points + 1).round().astype(int)[1:])
            scores = {}
            for condition, runner in emulators.items():
                needed, steps = runner.run(data, seed, train=condition != "global")
                scores[condition] = {p: top_k_eff(data.word_len[i], needed[i]) for p, i in parts.items()}
                head = {"seed": seed, "user": user, "condition": condition}
                sizes = {
                    "stream_words": n,
                    "last_words": len(parts["last"]),
                    "later_lines_words": len(parts["later_lines"]),
                }
                effs = {f"top_k_eff_{p}": v for p, v in scores[condition].items()}
                rate = {"learning_rate": runner.rate(seed) if condition != "global" else 0.0}
                rows.append({**head, **sizes, "train_steps": steps, **rate, **effs})
                saved, typed = np.cumsum(data.word_len - needed), np.cumsum(data.word_len)
                cumulative = {int(p): saved[p - 1] / typed[p - 1] for p in points}
                curve += [
                    {**head, "samples": p, "fraction": p / n, "cumulative_top_k_eff": c} for p, c in cumulative.items()
                ]
            g, o = scores["global"], scores["online"]
            log(
                f"seed {seed} user {n_user}/{len(users)} {user} ({n} samples): top-{params.k}-eff {g['stream']:.3f} -> "
                f"{o['stream']:.3f} online, last part {g['last']:.3f} -> {o['last']:.3f}"
            )
    return pd.DataFrame(rows), pd.DataFrame(curve)


def emulate_starts(params: Params, corpora: dict, models: dict, log=print) -> tuple[dict, pd.DataFrame]:
    """`emulate` from every start (`starts.each`): each start's rows, and the main start's cumulative curve."""
    got = starts.each(params, corpora, models, emulate, log)
    return {text: users for text, (users, _) in got.items()}, starts.main(got)[1]


def planted_control(params: Params, corpus: Corpus, models: GlobalModels, users: pd.DataFrame, log=print) -> dict:
    """The planted-signal control (`planted`) from the main start: per dose, the global model and online
    training over each test user's whole stream; dose 0 is the main rows."""
    emulator, wide_rows = Emulator(params, models), users.pivot(index=["seed", "user"], columns="condition")
    main = wide_rows["top_k_eff_stream"][["global", "online"]].set_axis(["top_k_eff_global", "top_k_eff"], axis=1)

    def measure(plant: Corpus, dose: float) -> list[dict]:
        rows = []
        for seed in models.entries:
            for user in plant.split.test:
                data = stream(plant, user, params.personal_train_fraction)[0]
                eff = [top_k_eff(data.word_len, emulator.run(data, seed, train)[0]) for train in (False, True)]
                rows.append({"seed": seed, "user": user, "top_k_eff_global": eff[0], "top_k_eff": eff[1]})
        log(f"planted dose {dose:g}: {len(rows)} streams, online {np.median([r['top_k_eff'] for r in rows]):.3f}")
        return rows

    per_user = planted.doses(params, corpus, measure, main.reset_index())
    return planted.tables(params, per_user.assign(condition="online"))  # the condition it ran in: the main rows'


def _wide(users: pd.DataFrame, condition: str, part: str) -> np.ndarray:
    return wide(users, f"top_k_eff_{part}", condition=condition)


def _judge(params: Params, users: pd.DataFrame, condition: str, part: str, first: dict) -> dict:
    """`condition` against the global model on one part: paired bootstrap over users."""
    better, worse = _wide(users, condition, part), _wide(users, "global", part)
    return effect_row(first, better, worse, streams.rng(params.seed, f"bootstrap/{part}"), params.bootstrap)


def effects(params: Params, users: pd.DataFrame, more: dict | None = None) -> pd.DataFrame:
    """Online vs global per part of the stream: paired bootstrap over users, the paper's change beside
    ours; a row the audit rule flags quotes the same effect with the validation users' choice, and
    names the data as its cause once the planted control in `more` passed (`planted.known_answer`)."""
    paper, rows, also = {n.quantity: n.value for n in PAPER.numbers}, [], ALSO in set(users.condition)
    for e in PART_EFFECTS:
        first = {"effect": e["claim"], "paper change": paper[e["paper"]]}
        row, why = _judge(params, users, "online", e["part"], first), None
        flagged = claims.audit(row["paper change"], row["our change"], row["ci low"], row["ci high"]) == "unexplained"
        if flagged and also:
            r, choice = (
                _judge(params, users, ALSO, e["part"], first),
                f"{params.also_optimizer} {params.also_learning_rate:g}",
            )
            text = f"with the validation users' choice ({choice}) online training changes {r['our change']:+.1%} "
            why = claims.Diagnosis(text + f"[{r['ci low']:+.1%}, {r['ci high']:+.1%}]", SECTION, claims.Kind.OPEN)
        if flagged and planted.passed(more):
            words = float(users[users.condition == "global"].drop_duplicates("user").stream_words.median())
            known = planted.known_answer(more["planted_curve"], params.planted_dose_star, words, PLANTED_SECTION)
            why = dataclasses.replace(known, text=f"{known.text}; {why.text}") if why else known
        rows.append(diagnosed(row, why))
    return pd.DataFrame(rows)


def per_user(users: pd.DataFrame) -> pd.DataFrame:
    """One row per (seed, user): both conditions side by side and the relative gain per part."""
    wide = users.pivot(index=["seed", "user"], columns="condition", values=[f"top_k_eff_{p}" for p in PARTS])
    wide.columns = [f"{c}_{cond}" for c, cond in wide.columns]
    out = wide.reset_index()
    for p in PARTS:
        out[f"gain_{p}"] = out[f"top_k_eff_{p}_online"] / out[f"top_k_eff_{p}_global"] - 1
    return out


def conclude(params: Params, corpora: dict, models: dict, users: dict, curve, wall_time_s: float, more=None):
    """Tables, headline numbers per seed (main start), the paper's numbers beside ours, the verdicts,
    every start's gains beside the main one's, and `more` (the planted control's tables)."""
    corpus, main_models, users_main = starts.main(corpora), starts.main(models), starts.main(users)
    med = users_main.groupby(["seed", "condition"])[[f"top_k_eff_{p}" for p in PARTS]].median()
    g, o = med.xs("global", level="condition"), med.xs("online", level="condition")
    c = Conclusion(NAME, params, PAPER)
    c.headlines(
        {"top-k-eff, without online training": g.top_k_eff_stream, "top-k-eff, online training": o.top_k_eff_stream}
    )
    c.headlines({f"relative gain, {name}": o[f"top_k_eff_{p}"] / g[f"top_k_eff_{p}"] - 1 for p, name in PARTS.items()})
    c.effect_rows(effects(params, users_main, more))
    c.paper_vs_ours()
    pairs = [(f"top_k_eff_{p}", "online", "global") for p in PARTS]
    every = pd.concat([u.assign(global_text=t) for t, u in users.items()], ignore_index=True)
    tables = {"users": users_main, "per_user": per_user(users_main), "summary": med.reset_index(), "curve": curve}
    tables |= {"starts": starts.sizes(corpora), "start_gains": starts.compare(params, users, pairs)}
    cache = pd.concat([m.cache().assign(global_text=t) for t, m in models.items()], ignore_index=True)
    tables |= {"users_every_start": every, "global_model_cache": cache}
    tables |= more or {}
    words = int(users_main[users_main.seed == users_main.seed.min()].drop_duplicates("user").stream_words.sum())
    return report.record(
        c, corpus, tables, wall_time_s, main_models, stream_words=words, online_training=params.online_training
    )


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpora = starts.load(params, speeches, log)
    models = starts.train(params, corpora, log)
    users, curve = emulate_starts(params, corpora, models, log)
    more = planted_control(params, starts.main(corpora), starts.main(models), starts.main(users), log)
    return conclude(params, corpora, models, users, curve, time.perf_counter() - start, more)
