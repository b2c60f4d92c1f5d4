"""DeepType D8 (Fig. 10b, Sec. 5.5 and 6.2.3): latency of one online training batch vs sequence
length, with and without reusing the inference results.

Online training buffers 16 samples the user typed and trains on them. Without reuse the update
is a fine-tune step: a forward pass through the embedding and both LSTM layers, then the softmax's
gradient. With reuse the keyboard kept, from the inference it ran anyway while the user typed,
the last LSTM layer's output at every position; the update computes the loss from that cache and
updates only the softmax (`techniques.deeptype.inference_reuse`). We time one batch of 16 at
each sequence length, both ways, in TensorFlow and through the exported TFLite file (the
signatures `train` and `train_from_cache`), starting from the cached global model of the first
training seed, and check that both ways give the same update.

Timings vary from run to run; they live in tables whose timing columns say "seconds", in the
figure and in run.json's headline, never in displayed text. The paper-vs-ours table and the
effects table use the analytic work of each test user's real online batches (deterministic); the
measured latencies are compared with the paper's in `latency_vs_paper`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.papers.deeptype import export as device_export
from ondevice.device import tflite, tflite_reuse
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.papers.deeptype.techniques import inference_reuse
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus, train_global  # noqa: F401  (stages the notebook calls)

NAME = "deeptype_online_latency"
MODES = ("without reuse", "with reuse", "inference (cached)")
REF_LENGTH = 18  # the paper: "exceeds 0.4 s when the sequence length is longer than 18"

PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Fig. 10b and Sec. 6.2.3 (Nexus 6, one online batch of 16); "
             "the paper gives the curves in words: without reuse > 0.4 s past length 18, with reuse 20-60 ms",
    numbers=(
        claims.PaperNumber("update cost without reuse, length 18 (relative to with reuse)", 0.4 / 0.04,
                           "Sec. 6.2.3: > 0.4 s vs 20-60 ms (midpoint 40 ms); ours: analytic FLOPs"),
        claims.PaperNumber("update cost with reuse, length 18 (relative)", 1.0,
                           "reference; ours: analytic FLOPs"),
        claims.PaperNumber("without reuse: update cost at length 30 / length 2", 15.0,
                           "Sec. 6.2.3: 'proportional to the sequence length'; ours: analytic FLOPs"),
    ),
    effects=(claims.Effect("reusing inference results lowers the cost of an online update",
                           "update cost without reuse, length 18 (relative to with reuse)",
                           "update cost with reuse, length 18 (relative)"),),
)
CLAIM = PAPER.effects[0].claim


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    online_batch_size: int = 16             # the paper buffers 16 samples
    lengths: tuple[int, ...] = tuple(range(2, 31, 2))
    repeats: int = 15                       # timed batches per (runtime, length, way); the median is reported
    warmup: int = 3                         # untimed batches first at each length
    online_learning_rate: float = 0.0005
    tflite_latency: bool = True             # also time the exported TFLite file
    parity_steps: int = 5                   # train_from_cache steps run in TF and TFLite from the same weights
    device_profile: str = ""                # a runner log (tools/ondevice_runner.py): extrapolate to that device
    bootstrap: int = 2000

    PRESETS = common.presets({
        "smoke": dict(lengths=(2, 10, 20, 30), repeats=5, warmup=2, parity_steps=3, bootstrap=500),
        "default": dict(),
    })

    def check(self) -> None:
        super().check()
        self.require(self.online_batch_size >= 1, "online_batch_size", "must be at least 1")
        self.require(len(self.lengths) >= 2 and all(n >= 1 for n in self.lengths), "lengths",
                     "must hold at least two positive lengths")
        self.require(self.repeats >= 1, "repeats", "must be at least 1")
        self.require(self.warmup >= 0, "warmup", "must be >= 0")
        self.require(self.parity_steps >= 1, "parity_steps", "must be at least 1")
        self.require(self.online_learning_rate > 0, "online_learning_rate", "must be positive")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def _model(params: Params, models: GlobalModels):
    model = models.model
    model.set_weights(models.weights[params.seed])
    return model


def _batch(params: Params, corpus: Corpus, length: int, rng: np.random.Generator):
    """A batch of `online_batch_size` random token sequences of `length`, every position labelled."""
    x = rng.integers(2, corpus.vocab.input_size, size=(params.online_batch_size, length), dtype=np.int32)
    y = rng.integers(2, corpus.vocab.size, size=(params.online_batch_size, length), dtype=np.int32)
    return x, y


def _user_batches(params: Params, corpus: Corpus, user: str) -> list[tuple[np.ndarray, np.ndarray]]:
    train, _ = corpus.personal(user, params.personal_train_fraction)
    data = device_export.user_batches(train, params.online_batch_size)
    return [(data["tokens"][i, :, :n], data["labels"][i, :, :n]) for i, n in enumerate(data["lengths"])]


def correctness(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> tuple[pd.DataFrame, bytes]:
    """The reuse update equals the fine-tune update on the same batch (TF: the softmax weights after
    one step; TFLite: the logits after one `train` vs one `train_from_cache` step), and TFLite's
    `train_from_cache` losses equal TensorFlow's over `parity_steps` steps. Returns the table and
    the exported flatbuffer (from the global weights)."""
    model = _model(params, models)
    start = model.get_weights()
    task = NextWordTask(params.k)
    batches = _user_batches(params, corpus, corpus.split.test[0])[: params.parity_steps]
    x, y = batches[0]
    online = inference_reuse.OnlineTrainer(model, task, params.online_learning_rate, params.optimizer)
    online.reset(start)
    online.step_without_reuse(x, y)
    plain = online.head_weights()
    online.reset(start)
    online.train_from_cache(online.infer_and_cache(x)["features"], y)
    reused = online.head_weights()
    weight_diff = max(float(np.abs(a - b).max()) for a, b in zip(plain, reused))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(plain, [w for w in start[-2:]]))

    online.reset(start)
    flatbuffer = tflite_reuse.convert(tflite_reuse.ReuseTrainableModel(model, task, params.online_learning_rate,
                                                                       params.optimizer))
    tf_losses = [float(online.train_from_cache(online.infer_and_cache(bx)["features"], by)) for bx, by in batches]
    online.reset(start)
    a, b = tflite.interpreter(flatbuffer), tflite.interpreter(flatbuffer)
    a.get_signature_runner("train")(tokens=x, labels=y)
    cached = b.get_signature_runner("infer_and_cache")(tokens=x)["features"]
    b.get_signature_runner("train_from_cache")(features=cached, labels=y)
    logit_diff = float(np.abs(a.get_signature_runner("infer")(tokens=x)["logits"]
                              - b.get_signature_runner("infer")(tokens=x)["logits"]).max())
    c = tflite.interpreter(flatbuffer)
    lite_losses = [float(c.get_signature_runner("train_from_cache")(
        features=c.get_signature_runner("infer_and_cache")(tokens=bx)["features"], labels=by)["loss"])
        for bx, by in batches]
    loss_diff = float(np.max(np.abs(np.array(tf_losses) - np.array(lite_losses))))
    table = pd.DataFrame([
        {"check": "TF: softmax weights, fine-tune step vs reuse step (max |difference|)", "value": weight_diff,
         "tolerance": 1e-6, "scale of the update": moved},
        {"check": "TFLite: logits after `train` vs after `train_from_cache` (max |difference|)", "value": logit_diff,
         "tolerance": 1e-4, "scale of the update": float("nan")},
        {"check": f"train_from_cache loss, TF vs TFLite over {len(batches)} steps (max |difference|)",
         "value": loss_diff, "tolerance": 1e-5, "scale of the update": float("nan")},
    ])
    table["passed"] = table.value <= table.tolerance
    log(f"correctness: {int(table.passed.sum())}/{len(table)} checks passed")
    return table, flatbuffer


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def latency(params: Params, corpus: Corpus, models: GlobalModels, flatbuffer: bytes | None, log=print) -> pd.DataFrame:
    """Seconds of one online batch per (runtime, length, way): the median (and 10th/90th
    percentiles) of `repeats` timed batches after `warmup`, the ways interleaved so that load from
    other processes hits them alike. 'inference (cached)' is the keyboard's forward pass that
    fills the cache (it runs anyway while the user types; shown for scale)."""
    model = _model(params, models)
    start = model.get_weights()
    task = NextWordTask(params.k)
    online = inference_reuse.OnlineTrainer(model, task, params.online_learning_rate, params.optimizer)
    runtimes = {}

    def tf_calls(x, y, feats):
        return {"without reuse": lambda: float(online.step_without_reuse(x, y)),
                "with reuse": lambda: float(online.train_from_cache(feats, y)),
                "inference (cached)": lambda: online.infer_and_cache(x)["logits"].numpy()}

    runtimes["TensorFlow"] = (lambda x: online.infer_and_cache(x)["features"], tf_calls)
    if params.tflite_latency and flatbuffer is not None:
        interp = tflite.interpreter(flatbuffer)
        train, cache, fromcache = (interp.get_signature_runner(s) for s in ("train", "infer_and_cache", "train_from_cache"))

        def lite_calls(x, y, feats):
            return {"without reuse": lambda: train(tokens=x, labels=y)["loss"],
                    "with reuse": lambda: fromcache(features=feats, labels=y)["loss"],
                    "inference (cached)": lambda: cache(tokens=x)["logits"]}

        runtimes["TFLite"] = (lambda x: cache(tokens=x)["features"], lite_calls)
    rows, begin = [], time.perf_counter()
    for runtime, (features, calls) in runtimes.items():
        rng = streams.rng(params.seed, "diagnostics/online_latency")
        for length in params.lengths:
            x, y = _batch(params, corpus, length, rng)
            fns = calls(x, y, np.asarray(features(x)))
            for _ in range(params.warmup):
                for fn in fns.values():
                    fn()
            times = {m: [] for m in fns}
            for _ in range(params.repeats):
                for m, fn in fns.items():
                    times[m].append(_time(fn))
            for m, t in times.items():
                rows.append({"runtime": runtime, "length": length, "way": m, "repeats": params.repeats,
                             "median_seconds": float(np.median(t)), "q10_seconds": float(np.quantile(t, 0.1)),
                             "q90_seconds": float(np.quantile(t, 0.9))})
        online.reset(start)
        log(f"latency: {runtime}, {len(params.lengths)} lengths x {len(MODES)} ways x {params.repeats} batches "
            f"({time.perf_counter() - begin:.1f}s)")
    return pd.DataFrame(rows)


def work_per_user(params: Params, corpus: Corpus, models: GlobalModels) -> pd.DataFrame:
    """Analytic FLOPs of one online update, averaged over each test user's real online batches
    (their typing in order, 16 samples a batch), without and with reuse. Deterministic."""
    config = common.model_config(params, corpus)
    rows = []
    for seed in params.seed_list:
        for user in corpus.split.test:
            lengths = [x.shape[1] for x, _ in _user_batches(params, corpus, user)]
            f = {reuse: np.mean([inference_reuse.flops_per_update(config, params.online_batch_size, n, reuse)
                                 for n in lengths]) for reuse in (False, True)}
            rows.append({"seed": seed, "user": user, "online_batches": len(lengths), "mean_length": float(np.mean(lengths)),
                         "mflops_without_reuse": f[False] / 1e6, "mflops_with_reuse": f[True] / 1e6,
                         "ratio": f[False] / f[True]})
    return pd.DataFrame(rows)


def device_extrapolation(params: Params, work: pd.DataFrame) -> pd.DataFrame | None:
    """With a device profile: each test user's online training (all their batches) on that device,
    extrapolated from the profile's steady step time, scaled by sequence length."""
    if not params.device_profile:
        return None
    profile = device_export.load_device_profile(params.device_profile)
    rows = []
    for r in work[work.seed == params.seed].itertuples():
        e = device_export.extrapolate_seconds(profile, r.online_batches, r.mean_length)
        rows.append({"user": r.user, "device": e["device"], "variant": e["variant"], "online_batches": r.online_batches,
                     "extrapolated_step_seconds": e["step_seconds"], "extrapolated_seconds": e["seconds"],
                     "label": e["label"]})
    return pd.DataFrame(rows)


def latency_vs_paper(table: pd.DataFrame, params: Params) -> pd.DataFrame:
    """Our measured medians at the paper's reference length beside the paper's values (seconds)."""
    ref = min(params.lengths, key=lambda n: abs(n - REF_LENGTH))
    rows = []
    for (runtime, way), g in table[table.length == ref].groupby(["runtime", "way"], sort=False):
        if way == "inference (cached)":
            continue
        rows.append({"runtime": runtime, "way": way, "length": ref,
                     "paper_seconds": 0.4 if way == "without reuse" else 0.04,
                     "our_median_seconds": float(g.median_seconds.iloc[0])})
    return pd.DataFrame(rows)


def _ratio(table: pd.DataFrame, runtime: str, length: int) -> float:
    g = table[(table.runtime == runtime) & (table.length == length)].set_index("way").median_seconds
    return float(g["without reuse"] / g["with reuse"])


def conclude(params: Params, corpus: Corpus, models: GlobalModels, checks: pd.DataFrame, table: pd.DataFrame,
             work: pd.DataFrame, flatbuffer: bytes | None, wall_time_s: float) -> record.Result:
    config = common.model_config(params, corpus)
    longest = max(params.lengths)
    headline = {}
    for runtime in table.runtime.unique():
        # timings of one model per run: the same value stands for every seed (timing does not depend on weights)
        headline[f"latency without / with reuse at length {longest}, {runtime}"] = claims.headline(
            [_ratio(table, runtime, longest)])
    headline["max |weight difference|, reuse vs fine-tune step"] = claims.headline([float(checks.value.iloc[0])], 1e-6)
    flops = lambda n, reuse: inference_reuse.flops_per_update(config, params.online_batch_size, n, reuse)
    ours = {PAPER.numbers[0].quantity: flops(REF_LENGTH, False) / flops(REF_LENGTH, True),
            PAPER.numbers[1].quantity: 1.0,
            PAPER.numbers[2].quantity: flops(30, False) / flops(2, False)}
    wide = work.pivot(index="seed", columns="user")
    measured = {CLAIM: (wide.mflops_without_reuse.to_numpy(), wide.mflops_with_reuse.to_numpy())}
    effects = claims.effects_table(PAPER, measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap)
    # the headline holds timing ratios: its columns are named so, and left out of exact comparisons
    head = claims.headline_table(headline).rename(columns=lambda c: c if c in ("name", "seeds") else f"{c} (time ratio or check)")
    tables = {"data": corpus.table(), "latency": table, "latency_vs_paper": latency_vs_paper(table, params),
              "correctness": checks, "work_per_user": work, "global_model_cache": models.cache(),
              "headline": head, "paper_vs_ours": claims.paper_vs_ours(PAPER, ours), "effects": effects}
    extrapolated = device_extrapolation(params, work)
    if extrapolated is not None:
        tables["device_extrapolation"] = extrapolated
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline,
        models={"deeptype_lstm_fine_tune_reuse.tflite": flatbuffer} if flatbuffer else {},
        artifacts={"split.json": corpus.split.to_dict()},
        data=[corpus.manifest.summary()], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": corpus.vocab.size, "split_digest": corpus.split.digest,
               "test_users": list(corpus.split.test), "seeds": params.seed_list, "timed_seed": params.seed,
               "flex_ops": tflite_reuse.flex_ops(flatbuffer) if flatbuffer else [],
               "global_models_from_cache": {s: e.hit for s, e in models.entries.items()},
               "device_profile": params.device_profile or None},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    models = train_global(params, corpus, log)
    checks, flatbuffer = correctness(params, corpus, models, log)
    table = latency(params, corpus, models, flatbuffer, log)
    work = work_per_user(params, corpus, models)
    return conclude(params, corpus, models, checks, table, work, flatbuffer, time.perf_counter() - start)


def plot_latency(table: pd.DataFrame, device: dict | None = None):
    """Fig. 10b: milliseconds of one online batch vs sequence length, with and without reuse, per runtime."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    data = table.assign(ms=lambda d: 1e3 * d.median_seconds)
    runtimes = list(data.runtime.unique())
    fig, axes = plt.subplots(1, len(runtimes), figsize=(5 * len(runtimes), 3.6), squeeze=False, sharey=True)
    palette = {"without reuse": "#d1495b", "with reuse": "#00798c", "inference (cached)": "#8c8c8c"}
    for ax, runtime in zip(axes.flat, runtimes):
        d = data[data.runtime == runtime]
        sns.lineplot(data=d, x="length", y="ms", hue="way", palette=palette, marker="o", ax=ax)
        for way, g in d.groupby("way"):
            ax.fill_between(g.length, 1e3 * g.q10_seconds, 1e3 * g.q90_seconds, color=palette[way], alpha=0.15, lw=0)
        ax.set(title=f"{runtime} (this machine)", xlabel="sequence length", ylabel="ms per online batch of 16")
        ax.legend(title="", frameon=False)
    sns.despine(fig)
    fig.suptitle("One online training batch vs sequence length (cf. DeepType Fig. 10b)", y=1.02)
    fig.tight_layout()
    return fig
