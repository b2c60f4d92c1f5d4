"""MoIL audio (M4-M6): personalising the pre-trained YAMNet on a user's ESC-50 sounds with global
dataset mixing GDM(alpha), layer freezing LF(n) and feature-map caching FMC.

Default scale, real data: the published YAMNet (its TFLite weights imported into our Keras
YAMNet) and ESC-50 from the data mirror. The user owns `local_classes` ESC-50 classes (their clips
split into training and validation, labels mapped to AudioSet labels as in Table 5.1). Without
AudioSet, "global" accuracy is measured on `global_classes` other ESC-50 classes the user never
trains on: their clips are split into an evaluation set and a disjoint mixing pool (GDM samples
only the pool), scored by AUC on their mapped AudioSet labels; forgetting shows there. Paper
scale: all of ESC-50 is local and the AudioSet evaluation set is global. Without ESC-50 and the
mirror, a synthetic stand-in set (and a YAMNet pre-trained on it) lets the notebook complete
(`audio_data`).

AUC: ROC AUC per AudioSet class present (positives and negatives among the clips), averaged;
`metrics.roc_auc` is the exact area under the empirical ROC curve, i.e. the trapezoidal rule
over its points. A clip's scores are the mean of its patches' sigmoid scores (YAMNet's clip
scoring, `audio_model`); training is per patch with the clip's labels, through `protocol`.

The incremental Adam rate, which the thesis does not give, is chosen among `learning_rates` on
held-out clips of the user's training set by `rate_choice.RULE` (fixed before any run), and every
configuration trains the thesis's 10 epochs at it; the forgetting ablation trains GDM(0),
GDM(alpha) and GDM(alpha)+LF(n) again at the other candidates.

Stages (the notebook calls one per section): `audio_data.load_data`, `audio_model.pretrained`, `choose_rate` (whose
`params` every later stage takes), `gdm_sweep`, `lf_sweep`, `fmc`, `audio_model.benchmark`, `on_device`,
`forgetting_ablation` (`forgetting`), `conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.papers.moil import forgetting, global_proxy, protocol, rate_choice, report
from ondevice.papers.moil.audio_data import AudioData, AudioParams, classes_table, hold_out, load_data
from ondevice.papers.moil.audio_model import HeldOut, Personalizer, Pretrained, benchmark, pretrained
from ondevice.papers.moil.protocol import Run
from ondevice.papers.moil.report import benchmark_ratios, cache_table, fmc_equality
from ondevice.params import presets
from ondevice.report import facts, record
from ondevice.report.conclusion import Conclusion, diagnose

NAME = "moil_audio"
PAPER = facts.paper(NAME)
PAPER_TIME = {n.quantity: n.value for n in facts.paper(NAME, "time").numbers}  # judged on measured step times
OWN_PRESETS = {
    "smoke": dict(local_classes=3, global_classes=3, alpha=0.5, alphas=(0.0, 0.5), n=2, learning_rates=(5e-4, 5e-5))
    | dict(seeds=2),
    "default": dict(  # local_val_fraction is the thesis's 0.2: 2 of each class's 8-10 clips
        local_classes=20,
        global_classes=30,
        alpha=0.25,  # 1 of each held-out class's 4-6 pool clips (the thesis's 0.1% of this pool is none)
        alphas=(0.0, 0.25, 1.0),
        ns=(1, 3, 5),
        bootstrap=1000,
        seeds=3,  # every sweep and FMC run three times (the rate choice and the forgetting ablation: the first seed)
    ),
    "paper": dict(seeds=3),
}


@dataclass(frozen=True)
class Params(AudioParams):
    alpha: float = 0.001  # the thesis: 0.1%
    alphas: tuple[float, ...] = (0.0, 0.001, 0.01, 0.1)
    n: int = 3  # the thesis: LF(3)
    ns: tuple[int, ...] = (1, 3, 5)
    epochs: int = 10  # the thesis (Sec. 5.3.1): "since we found the model converged on the local dataset"
    # Adam rates for incremental training (the thesis gives none; 5e-4 is its pre-training rate):
    # `choose_rate` picks one by rate_choice.RULE on held-out training clips, the ablation trains the others
    learning_rates: tuple[float, ...] = (5e-4, 1.5e-4, 5e-5)
    learning_rate: float = 0.0005  # the protocol's; `choose_rate` replaces it with the chosen candidate

    PRESETS = presets(protocol.SHARED_PRESETS, OWN_PRESETS)

    def check(self) -> None:
        super().check()
        rates = self.learning_rates
        self.require(
            len(rates) >= 1 and all(r > 0 for r in rates) and len(set(rates)) == len(rates),
            "learning_rates",
            "must be one or more distinct positive Adam rates",
        )
        self.require(
            self.learning_rate in rates, "learning_rate", f"must be one of learning_rates {rates} (the candidates)"
        )


def choose_rate(params: Params, data: AudioData, pre: Pretrained, log=print) -> rate_choice.Choice:
    """The incremental rate by `rate_choice.RULE`, on `holdout_fraction` of each class's training
    clips (never the validation clips, the local test set, nor the global evaluation clips)."""
    fit, held = hold_out(data, params.holdout_fraction, params.seed)
    clips = {"held-out training clips": len(held), "training clips without them": len(fit.local_train)}
    return rate_choice.select(params, lambda p: HeldOut(p, fit, pre, held), clips, log)


def gdm_sweep(params: Params, data: AudioData, pre: Pretrained, log=print) -> list[Run]:
    """GDM(alpha) with every layer training, for each alpha (Fig. 5.6)."""
    return protocol.gdm_sweep(params, Personalizer(params, data, pre), log)


def lf_sweep(params: Params, data: AudioData, pre: Pretrained, log=print) -> list[Run]:
    """GDM(alpha) + LF(n) for each n (Fig. 5.8)."""
    return protocol.lf_sweep(params, Personalizer(params, data, pre), log)


def fmc(params: Params, data: AudioData, pre: Pretrained, lf_runs: list[Run], log=print):
    """GDM(alpha) + LF(n) + FMC per seed, and the LF(n) runs without the cache they must equal."""
    cached = protocol.fmc(params, Personalizer(params, data, pre), log)
    return cached, [next(r for r in lf_runs if r.n == params.n and r.seed == c.seed) for c in cached]


def forgetting_ablation(params: Params, data: AudioData, pre: Pretrained, alpha_runs, lf_runs, log=print):
    """GDM(0), GDM(alpha), GDM(alpha) + LF(n) at each other rate; forgetting against the global set's size."""
    make, stream = lambda p: Personalizer(p, data, pre), "moil-audio/bootstrap/forgetting"
    ablation = forgetting.ablate(params, make, [*alpha_runs, *lf_runs], PAPER, pre.global_auc, stream, log)
    ablation.size = global_proxy.measure(ablation, pre.weights, data.global_eval, params.seed)
    return ablation


def on_device(params: Params, data: AudioData, pre: Pretrained, log=print):
    """The personal model's first training steps in TensorFlow and through TensorFlow Lite."""
    return Personalizer(params, data, pre).on_device("moil-audio/diagnostics/tflite", log)


def history_table(runs: list[Run]) -> pd.DataFrame:
    """Loss, AUCs and seconds per epoch of every run and seed (epoch 0: the pre-trained model)."""
    rows = [{"run": r.name, "seed": r.seed, **h} for r in runs for h in r.history]
    return pd.DataFrame(rows)[["run", "seed", "epoch", "global_auc", "local_auc", "loss", "epoch_seconds"]]


def runs_table(runs: list[Run], pre: Pretrained, params: Params) -> pd.DataFrame:
    """Each run's (and seed's) AUCs after its last epoch, against the pre-trained model's, and its training time."""
    return pd.DataFrame(
        [
            {
                "run": r.name,
                "seed": r.seed,
                "alpha": r.alpha,
                "n": r.n or 0,
                "fmc": r.fmc,
                "training clips": r.samples,
                "steps per epoch": r.steps_per_epoch,
                "global AUC": float(r.scores["global"].mean()),
                "local AUC": float(r.scores["local"].mean()),
                "global AUC change": float(r.scores["global"].mean() / pre.global_auc.mean() - 1),
                "local AUC change": float(r.scores["local"].mean() / pre.local_auc.mean() - 1),
                "steady_step_seconds": r.steady_step_seconds,
                "training_time_seconds": params.epochs * r.steps_per_epoch * r.steady_step_seconds + r.cache_seconds,
            }
            for r in runs
        ]
    )


def paper_numbers(params: Params, pre: Pretrained, by_alpha: dict, lf_auc, fmc_auc, cache: pd.DataFrame) -> dict:
    """Our values of the thesis's numbers (means over seeds and classes; the cache sizes per 10 s)."""
    ten = cache[cache.per == "10 s of audio"].set_index("what").bytes
    ours = {
        "global AUC, pre-trained": float(pre.global_auc.mean()),
        "global AUC, GDM(0)": float(by_alpha[0.0].mean()),
        "global AUC, GDM(alpha)": float(by_alpha[params.alpha].mean()),
        "global AUC, GDM(alpha) + LF(n)": float(lf_auc.mean()),
        "global AUC, GDM(alpha) + LF(n) + FMC": float(fmc_auc.mean()),
        "largest global AUC loss over the alpha sweep": float(
            max(1 - v.mean() / pre.global_auc.mean() for v in by_alpha.values())
        ),
        "cached bytes per 10 s of audio (KB)": ten["feature-map cache"] / 1024,
        "raw waveform bytes per 10 s of audio (KB)": ten["raw waveform, float32 16 kHz"] / 1024,
    }
    ours["cache size / raw waveform size"] = (
        ours["cached bytes per 10 s of audio (KB)"] / ours["raw waveform bytes per 10 s of audio (KB)"]
    )
    return ours


def conclude(
    params: Params,
    data: AudioData,
    pre: Pretrained,
    choice: rate_choice.Choice,
    alpha_runs: list[Run],
    lf_runs: list[Run],
    cached: list[Run],
    lf: list[Run],
    ablation: forgetting.Ablation,
    bench: pd.DataFrame,
    on_device_table,
    flatbuffer,
    wall_time_s: float,
) -> record.Result:
    """Tables, headline numbers over seeds, the thesis's numbers beside ours and three-way verdicts
    (`Conclusion`); effects pair AudioSet classes and seeds, (seeds, classes) arrays."""
    auc = lambda runs, part="global": np.stack([r.scores[part].to_numpy() for r in sorted(runs, key=lambda r: r.seed)])
    by_alpha = {a: auc([r for r in alpha_runs if r.alpha == a]) for a in params.alphas}
    g0, ga, lf_auc, fmc_auc = by_alpha[0.0], by_alpha[params.alpha], auc(lf), auc(cached)
    pre_global = np.stack([pre.global_auc.to_numpy()] * len(params.seed_list))
    cache, named = cache_table(cached[0], data), lambda text: text.replace("LF(n)", f"LF({params.n})")
    c = Conclusion(NAME, params, PAPER)
    seeds = {
        "global AUC, pre-trained": pre_global,
        "global AUC, GDM(0)": g0,
        f"global AUC, GDM({params.alpha:g})": ga,
        f"global AUC, GDM({params.alpha:g}) + LF({params.n})": lf_auc,
        f"local AUC, GDM({params.alpha:g}) + LF({params.n})": auc(lf, "local"),
        "local AUC, pre-trained": np.stack([pre.local_auc.to_numpy()] * len(params.seed_list)),
    }
    c.headlines({q: list(map(float, v.mean(axis=1))) for q, v in seeds.items()})
    numbers = c.paper_vs_ours(paper_numbers(params, pre, by_alpha, lf_auc, fmc_auc, cache))
    numbers["quantity"] = numbers.quantity.map(named)
    measured = {
        "GDM(0) loses global AUC (catastrophic forgetting)": (pre_global, g0),
        "mixing global data keeps more global AUC than GDM(0)": (ga, g0),
        "LF(n) keeps more global AUC than full training": (lf_auc, ga),
        "FMC changes no global AUC": (fmc_auc, lf_auc),
    }
    effects = c.effects(measured, streams.rng(params.seed, "moil-audio/bootstrap"), n_boot=params.bootstrap)
    effects["effect"] = effects.effect.map(named)
    for claim, why in global_proxy.diagnoses(ablation.size, params.learning_rate, PAPER, data).items():
        effects = c.effect_rows(diagnose(effects, claim, why))  # on every forgetting row, flagged or not
    timing = report.audio_timing_effects(params, bench, PAPER_TIME)
    runs = [*alpha_runs, *lf_runs, *cached]
    tables = {
        "data": data.table(),
        "classes": classes_table(data),
        "history": history_table(runs),
        "runs": runs_table(runs, pre, params),
        "fmc_equality": fmc_equality(cached, lf),
        "cache_size": cache,
        "benchmark": bench.drop(columns="step_seconds"),
        "timing_effects": timing,
        "rate_choice": choice.table,
        "rate_history": choice.history,
        "forgetting_effects": (per_rate := ablation.table(params.n, effects)),
        "forgetting_by_rate": forgetting.by_rate(per_rate, choice.table, len(params.seed_list)),
        "forgetting_by_size": ablation.size,
        "forgetting_history": ablation.history(),
    }
    if pre.agreement is not None:
        tables["tflite_agreement"] = pre.agreement
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    return c.result(
        tables,
        data.data,
        data.stand_in,
        wall_time_s,
        models={"yamnet_personal_trainable.tflite": flatbuffer} if flatbuffer else {},
        source=data.source,
        weights=pre.source,
        local_classes=data.local_categories,
        global_classes=data.global_categories,
        learning_rate={"chosen": choice.rate, "rule": rate_choice.RULE, **choice.clips},
        benchmark_time_ratios=benchmark_ratios(bench, params.n),
        timing_effects=timing.to_dict("records"),
        **data.notes,
        tflite_max_loss_difference=None if on_device_table is None else float(on_device_table.abs_difference.max()),
    )


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load_data(params, log)
    pre = pretrained(params, data, log)
    choice = choose_rate(params, data, pre, log)
    params = choice.params
    alpha_runs = gdm_sweep(params, data, pre, log)
    lf_runs = lf_sweep(params, data, pre, log)
    cached, lf = fmc(params, data, pre, lf_runs, log)
    bench = benchmark(params, data, pre, log)
    table, flatbuffer = on_device(params, data, pre, log)
    ablation = forgetting_ablation(params, data, pre, alpha_runs, lf_runs, log)
    wall = time.perf_counter() - start
    return conclude(
        params, data, pre, choice, alpha_runs, lf_runs, cached, lf, ablation, bench, table, flatbuffer, wall
    )


def main(argv=None) -> None:
    """`python -m ondevice.papers.moil.experiments.moil_audio [scale]`: the step-time benchmark alone, its
    ratios printed (one run; timings vary from run to run, so the notebook keeps them out of its
    displayed tables)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    params = Params.for_scale(args[0] if args else "default")
    data = load_data(params)
    bench = benchmark(params, data, pretrained(params, data))
    for name, ratio in benchmark_ratios(bench, params.n).items():
        print(f"{name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
