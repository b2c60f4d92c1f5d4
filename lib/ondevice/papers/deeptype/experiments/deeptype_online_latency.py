"""DeepType D8 (Fig. 10b, Sec. 5.5 and 6.2.3): latency of one online training batch vs sequence
length, with and without reusing the inference results.

Online training buffers 16 samples the user typed and trains on them. Without reuse the update
is a fine-tune step: a forward pass through the embedding and both LSTM layers, then the softmax's
gradient. With reuse the keyboard kept, from the inference it ran anyway while the user typed,
the last LSTM layer's output at every position, and updates only the softmax from that cache
(`training/inference_reuse.py`). We time one batch of 16 at each length, both ways, in
TensorFlow and through the exported TFLite file, from the first seed's cached global model, and
check that both ways give the same update.

Timings vary from run to run: they live in tables whose timing columns say "seconds", in the
figure and in the headline. The paper-vs-ours and effects tables use the analytic work of each
test user's real online batches (deterministic).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.device import tflite, tflite_reuse
from ondevice.papers.deeptype import common, protocol, reuse_compressed, reuse_time
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.papers.deeptype.reuse_compressed import COMPRESSED, UNCOMPRESSED
from ondevice.papers.deeptype.techniques import svd_rank
from ondevice.report import claims, facts, record
from ondevice.report.conclusion import Conclusion
from ondevice.tasks import typing_protocol
from ondevice.training import inference_reuse

NAME = "deeptype_online_latency"
PAPER = facts.paper(NAME)
MODES = ("without reuse", "with reuse", "inference (cached)")
QUANTILES = ("median", "q10", "q90")
VALUES = facts.load("deeptype")["deeptype_online_latency"]["values"]  # Sec. 6.2.3 / Fig. 10b
REF_LENGTH = VALUES["reference_length"]
SECTION = "Which reading of the two steps"


@dataclass(frozen=True)
class Params(typing_protocol.DeepTypeParams, svd_rank.SVDParams):
    online_batch_size: int = 16  # the paper buffers 16 samples
    lengths: tuple[int, ...] = tuple(range(2, 31, 2))
    repeats: int = 15  # timed batches per (runtime, length, way); the median is reported
    warmup: int = 3  # untimed batches first at each length
    personal_optimizer: str = "adam"  # online training from a fresh state (a deviation from the paper's SGD)
    personal_learning_rate: float = 0.0005
    tflite_latency: bool = True  # also time the exported TFLite file
    parity_steps: int = 5  # train_from_cache steps run in TF and TFLite from the same weights
    device_profile: str = ""  # a runner log (tools/ondevice_runner.py): extrapolate to that device
    bootstrap: int = 2000
    timed_batches: int = 12  # of each test user's own online batches, evenly spread (`reuse_time`)
    timed_repeats: int = 3  # timed updates per batch and way; the median is kept

    PRESETS = typing_protocol.presets(
        {
            "smoke": dict(lengths=(2, 10, 20, 30), repeats=5, warmup=2, parity_steps=3, bootstrap=500)
            | dict(timed_batches=3, timed_repeats=2)
            | svd_rank.SMOKE
        }
    )

    def check(self) -> None:
        super().check()
        self.require(len(self.lengths) >= 2 and min(self.lengths) >= 1, "lengths", "must hold two positive lengths")
        for name in ("online_batch_size", "repeats", "parity_steps", "timed_batches", "timed_repeats"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        self.require(self.warmup >= 0, "warmup", "must be >= 0")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")
        svd_rank.SVDParams.check(self)


def _online(params: Params, models: GlobalModels):
    """The first seed's global model, its weights, and its online trainer (personal optimizer)."""
    model = models.model
    model.set_weights(models.weights[params.seed])
    task = common.task(params)
    return model, model.get_weights(), task, protocol.online_trainer(params, model, task, reuse=True)


def _user_batches(params: Params, corpus: Corpus, user: str) -> list[tuple[np.ndarray, np.ndarray]]:
    return protocol.online_batches(corpus.personal(user, params.personal_train_fraction)[0], params.online_batch_size)


def _max_diff(a, b) -> float:
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


def correctness(
    params: Params, corpus: Corpus, models: GlobalModels, compressed, log=print
) -> tuple[pd.DataFrame, bytes]:
    """The reuse update equals the fine-tune update on the same batch (TF: the softmax weights after
    one step, on the uncompressed and on the combined compressed model; TFLite: the logits after one
    `train` vs one `train_from_cache` step), and TFLite's `train_from_cache` losses equal
    TensorFlow's over `parity_steps` steps. Returns the table and the flatbuffer exported from the
    global weights."""
    model, start, task, online = _online(params, models)
    batches = _user_batches(params, corpus, corpus.split.test[0])[: params.parity_steps]
    x, y = batches[0]
    weight_diff, moved = reuse_compressed.reuse_check(online, start, x, y)
    small_diff, small_moved = reuse_compressed.compressed_check(params, corpus, models, compressed)
    online.reset(start)
    training = (params.personal_learning_rate, params.personal_optimizer)
    module = inference_reuse.OnlineTrainer(model, task, *training, clip_norm=params.personal_clip_norm)
    flatbuffer = tflite.convert(module, tflite.REUSE_SIGNATURES)
    tf_losses = [
        float(online.train_from_cache(online.infer_and_cache(bx)["features"], by)["loss"]) for bx, by in batches
    ]
    online.reset(start)
    a, b, c = (tflite.interpreter(flatbuffer).get_signature_runner for _ in range(3))
    a("train")(tokens=x, labels=y)
    b("train_from_cache")(features=b("infer_and_cache")(tokens=x)["features"], labels=y)
    logit_diff = _max_diff([a("infer")(tokens=x)["logits"]], [b("infer")(tokens=x)["logits"]])
    cached = [c("infer_and_cache")(tokens=bx)["features"] for bx, _ in batches]
    lite = [c("train_from_cache")(features=f, labels=by)["loss"] for f, (_, by) in zip(cached, batches)]
    loss_diff = float(np.max(np.abs(np.array(tf_losses) - np.array(lite, float))))
    rows = [
        ("TF: softmax weights, fine-tune step vs reuse step (max |difference|)", weight_diff, 1e-6, moved),
        (f"TF, {COMPRESSED} model: the same (max |difference|)", small_diff, 1e-6, small_moved),
        ("TFLite: logits after `train` vs after `train_from_cache` (max |difference|)", logit_diff, 1e-4, np.nan),
        (f"train_from_cache loss, TF vs TFLite over {len(batches)} steps (max |difference|)", loss_diff, 1e-5, np.nan),
    ]
    table = pd.DataFrame(rows, columns=["check", "value", "tolerance", "scale of the update"])
    table["passed"] = table.value <= table.tolerance
    log(f"correctness: {int(table.passed.sum())}/{len(table)} checks passed")
    return table, flatbuffer


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _tf_calls(online):
    return lambda x, y, f: {
        "without reuse": lambda: float(online.train(x, y)["loss"]),
        "with reuse": lambda: float(online.train_from_cache(f, y)["loss"]),
        "inference (cached)": lambda: online.infer_and_cache(x)["logits"].numpy(),
    }


def latency(params: Params, corpus: Corpus, models: GlobalModels, flatbuffer, compressed, log=print) -> pd.DataFrame:
    """Seconds of one online batch per (runtime, length, way): the median (and 10th/90th
    percentiles) of `repeats` timed batches after `warmup`, the ways interleaved so that load from
    other processes hits them alike. 'inference (cached)' is the keyboard's forward pass that
    fills the cache (it runs anyway while the user types; shown for scale). The combined
    compressed model (first test user's words, `reuse_compressed`) runs in TensorFlow too."""
    _, start, _, online = _online(params, models)
    small, vmap = reuse_compressed.user_model(params, corpus, models, compressed, corpus.split.test[0], params.seed)
    small = protocol.online_trainer(params, small, common.task(params), reuse=True)
    features = lambda trainer: lambda x: trainer.infer_and_cache(x)["features"]  # noqa: E731
    runtimes = {"TensorFlow": (_tf_calls(online), features(online), corpus.vocab.size)}
    runtimes[f"TensorFlow, {COMPRESSED}"] = (_tf_calls(small), features(small), vmap.size)
    if params.tflite_latency and flatbuffer is not None:
        lite = tflite.interpreter(flatbuffer).get_signature_runner
        train, cache, fromcache = lite("train"), lite("infer_and_cache"), lite("train_from_cache")
        calls = lambda x, y, f: {  # noqa: E731
            "without reuse": lambda: train(tokens=x, labels=y)["loss"],
            "with reuse": lambda: fromcache(features=f, labels=y)["loss"],
            "inference (cached)": lambda: cache(tokens=x)["logits"],
        }
        runtimes["TFLite"] = (calls, lambda x: cache(tokens=x)["features"], corpus.vocab.size)
    rows, begin = [], time.perf_counter()
    for runtime, (calls, feature, words) in runtimes.items():
        rng = streams.rng(params.seed, "diagnostics/online_latency")
        for length in params.lengths:
            x = rng.integers(2, corpus.vocab.input_size, size=(params.online_batch_size, length), dtype=np.int32)
            y = rng.integers(2, words, size=(params.online_batch_size, length), dtype=np.int32)
            fns = calls(x, y, np.asarray(feature(x)))
            for _ in range(params.warmup):
                for fn in fns.values():
                    fn()
            times = {m: [] for m in fns}
            for _ in range(params.repeats):
                for m, fn in fns.items():
                    times[m].append(_seconds(fn))
            for m, t in times.items():
                rows.append((runtime, length, m, params.repeats, np.median(t), *np.quantile(t, [0.1, 0.9])))
        online.reset(start)
        log(
            f"latency: {runtime}, {len(params.lengths)} lengths x {len(MODES)} ways, {time.perf_counter() - begin:.1f}s"
        )
    return pd.DataFrame(rows, columns=["runtime", "length", "way", "repeats", *(f"{q}_seconds" for q in QUANTILES)])


def latency_vs_paper(table: pd.DataFrame, params: Params) -> pd.DataFrame:
    """Our measured medians at the paper's reference length beside the paper's values (seconds)."""
    ref = min(params.lengths, key=lambda n: abs(n - REF_LENGTH))
    at = table[(table.length == ref) & (table.way != "inference (cached)")]
    paper = np.where(at.way == "without reuse", VALUES["seconds_without_reuse"], VALUES["seconds_with_reuse"])
    return at[["runtime", "way", "length"]].assign(paper_seconds=paper, our_median_seconds=at.median_seconds.to_numpy())


def conclude(params, corpus, models, compressed, sweep, checks, table, work, timed, flatbuffer, wall_time_s):
    config, longest, batch = typing_protocol.model_config(params, corpus), max(params.lengths), params.online_batch_size
    c = Conclusion(NAME, params, PAPER)
    for runtime in table.runtime.unique():  # timing does not depend on the weights: one value stands for every seed
        g = table[(table.runtime == runtime) & (table.length == longest)].set_index("way").median_seconds
        c.headlines(
            {f"latency without / with reuse at length {longest}, {runtime}": [g["without reuse"] / g["with reuse"]]}
        )
    c.headlines(
        {"max |weight difference|, reuse vs fine-tune step": [checks.value.iloc[0]]},
        {"max |weight difference|, reuse vs fine-tune step": 1e-6},
    )
    # where the paper measures (Fig. 6): the combined compressed model, at the median user's words
    kept, rank = int(np.median(work[work.model == COMPRESSED].output_words)), compressed.rank
    small = reuse_compressed.config(params, corpus, kept)
    flops = lambda reuse: inference_reuse.flops_per_update(config, batch, REF_LENGTH, reuse)  # noqa: E731
    plain = flops(False) / flops(True)
    c.headlines({f"update cost without / with reuse, length {REF_LENGTH}, {UNCOMPRESSED} model (FLOPs)": [plain]})
    # the paper's numbers are latencies: ours are measured seconds on the compressed model (Fig. 10b's curve)
    ms = table[table.runtime == f"TensorFlow, {COMPRESSED}"].pivot(
        index="length", columns="way", values="median_seconds"
    )
    ref = min(params.lengths, key=lambda n: abs(n - REF_LENGTH))
    values = (
        ms["without reuse"][ref],
        ms["with reuse"][ref],
        ms["without reuse"][longest] / ms["without reuse"].iloc[0],
    )
    measured = {PAPER.effects[0].claim: reuse_time.pairs(timed, COMPRESSED)}
    readings = pd.DataFrame(
        {
            UNCOMPRESSED: inference_reuse.cost_readings(config, batch, REF_LENGTH),
            COMPRESSED: inference_reuse.cost_readings(small, batch, REF_LENGTH, rank),
        }
    )
    ratio = PAPER.numbers[0].value / PAPER.numbers[1].value  # the paper's without / with reuse (10x)
    why = {PAPER.effects[0].claim: reuse_time.diagnosis(timed, readings, ratio, SECTION)}
    c.effects(measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap, diagnoses=why)
    c.paper_vs_ours({n.quantity: v for n, v in zip(PAPER.numbers, values)})
    # the headline holds timing ratios: its columns are named so, and left out of exact comparisons
    c.tables["headline"] = claims.headline_table(c.headline).rename(
        columns=lambda col: col if col in ("name", "seeds") else f"{col} (time ratio or check)"
    )
    tables = dict(data=corpus.table(), latency=table, latency_vs_paper=latency_vs_paper(table, params))
    tables.update(correctness=checks, work_per_user=work, global_model_cache=models.cache())
    tables.update(update_seconds_per_user=timed, update_time_readings=reuse_time.ratios(timed))
    tables.update(svd_rank_sweep=sweep, svd_model_cache=compressed.cache())
    tables["cost_readings"] = readings.rename_axis("reading").reset_index()
    extrapolated = reuse_compressed.device_extrapolation(params, work)
    if extrapolated is not None:
        tables["device_extrapolation"] = extrapolated
    notes = dict(
        vocabulary_size=corpus.vocab.size, split_digest=corpus.split.digest, test_users=list(corpus.split.test)
    )
    notes.update(seeds=params.seed_list, timed_seed=params.seed, global_models_from_cache=models.from_cache)
    notes.update(svd_rank=rank, svd_rank_rule=f"{svd_rank.RULE}; tolerance {params.svd_rank_tolerance:g}")
    notes.update(flex_ops=tflite_reuse.flex_ops(flatbuffer) if flatbuffer else [])
    notes["device_profile"] = params.device_profile or None
    files = {"deeptype_lstm_fine_tune_reuse.tflite": flatbuffer} if flatbuffer else {}
    data, artifacts = [corpus.manifest.summary()], {"split.json": corpus.split.to_dict()}
    return c.result(tables, data, corpus.manifest.stand_in_for, wall_time_s, files, artifacts, **notes)


def run(params: Params, speeches=None, log=print) -> record.Result:
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    models = train_global(params, corpus, log)
    compressed, sweep = reuse_compressed.compress_global(params, corpus, models, log)
    checks, flatbuffer = correctness(params, corpus, models, compressed, log)
    table = latency(params, corpus, models, flatbuffer, compressed, log)
    work = reuse_compressed.work_per_user(params, corpus, compressed.rank)
    timed = reuse_time.per_user(params, corpus, models, compressed, log)
    args = (compressed, sweep, checks, table, work, timed, flatbuffer)
    return conclude(params, corpus, models, *args, time.perf_counter() - start)


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
