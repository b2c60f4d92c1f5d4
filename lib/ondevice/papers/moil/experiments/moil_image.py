"""MoIL image classification (thesis Sec. 5.2-5.3, rows M1-M3 and the image half of M6):
incremental training of MobileNetV2 with global dataset mixing (GDM), layer freezing (LF) and
feature-map caching (FMC), against training from scratch on global + local data.

Default scale, real data: Fashion-MNIST is the global set (stand-in for ImageNet) and
scikit-learn's bundled handwritten digits the user's local set (stand-in for the 225 bird
species), one label space, top-1 accuracy on both test sets after every epoch (`image_data`).
Paper scale, real data (manual downloads): ImageNet and the 225 bird species streamed from their
JPEG files; the pre-trained model is Keras's MobileNetV2 with its ImageNet weights.

Runs, each starting from the global model pre-trained on the global set (cached, `image_model`):
`baseline` (from scratch on all global + local training data), GDM(alpha) for every alpha of the
sweep (0 = local data only), GDM(alpha)+LF(n) for every n of the sweep, and
GDM(alpha)+LF(n)+FMC (the head trained from cached feature maps), for `seeds` incremental seeds,
all through `protocol`. Training time = steady-state seconds per step (median after warm-up) x
steps of the configuration, plus the caching pass for FMC; every configuration is timed in the
same run, and reported as ratios. Timing numbers differ from run to run: they live in tables whose
timing columns say "time"/"seconds", in figures and in log lines, never in displayed tables.

The notebook calls one stage per section: `load_data`, `pretrain`, `gdm_sweep`, `lf_sweep`,
`fmc`, `timing`, `cache_size`, `on_device`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.papers.moil import protocol, report
from ondevice.papers.moil.image_data import STAND_IN, Data, ImageParams, load_data
from ondevice.papers.moil.image_model import Personalizer, Pretrained, cache_size, pretrain, timing
from ondevice.papers.moil.protocol import Run, fmc, gdm_sweep, label, lf_sweep
from ondevice.papers.moil.report import fmc_vs_lf, step_times
from ondevice.params import presets
from ondevice.report import facts, record
from ondevice.report.conclusion import Conclusion

NAME = "moil_image"
PAPER = facts.paper(NAME)  # accuracy losses read as percentage points (the thesis does not say)
PAPER_TIME = {n.quantity: n.value for n in facts.paper(NAME, "time").numbers}  # ratios of training times
PANELS = ("(a) global accuracy (Fashion-MNIST)", "(b) local accuracy (digits)")  # titles of the curves
OWN_PRESETS = {
    "smoke": dict(
        bn_momentum=0.5,
        global_train=600,
        global_test=300,
        local_samples=400,
        pretrain_epochs=2,
        baseline_epochs=3,
        baseline_patience=1,
        alpha=0.2,
        alphas=(0.0, 0.2),
        seeds=1,
    ),
    "default": {},
    "paper": dict(
        bn_momentum=0.999,
        image_size=224,
        width=1.0,
        global_data="imagenet",
        global_train=0,
        global_test=0,
        pretrain_epochs=0,
        baseline_epochs=150,
        epochs=60,
        alpha=0.01,
        alphas=(0.0, 0.001, 0.01, 0.1),
        ns=(1, 2, 3),
        seeds=3,
    ),
}


@dataclass(frozen=True)
class Params(ImageParams):
    alpha: float = 0.05
    alphas: tuple[float, ...] = (0.0, 0.01, 0.05, 0.2)
    n: int = 1  # the thesis: LF(1)
    ns: tuple[int, ...] = (1, 2, 3, 6)
    epochs: int = 8
    learning_rate: float = 0.001  # Adam, pre-training and incremental (the thesis gives none)
    seeds: int = 3  # incremental seeds: seed, seed + 1, ...

    PRESETS = presets(protocol.SHARED_PRESETS, OWN_PRESETS)

    def check(self) -> None:
        super().check()
        self.require(len(self.ns) >= 2, "ns", "must hold at least two values (more frozen layers is an effect)")


def history_table(pre: Pretrained, runs: list[Run]) -> pd.DataFrame:
    """Loss and accuracies per epoch of the baseline and of every run (epoch 0: the pre-trained model)."""
    rows = [
        {"run": r.name, "alpha": r.alpha, "n": r.n or 0, "fmc": r.fmc, "seed": r.seed, **h}
        for r in runs
        for h in r.history
    ]
    base = pd.DataFrame(pre.entries["baseline"].info["history"]).assign(
        run="baseline", alpha=1.0, n=0, fmc=False, seed=-1
    )
    return pd.concat([base, pd.DataFrame(rows)], ignore_index=True)[
        ["run", "alpha", "n", "fmc", "seed", "epoch", "loss", "global_accuracy", "local_accuracy"]
    ]


def on_device(params: Params, personal: Personalizer, log=print):
    """The personal model's first training steps in TensorFlow and through TensorFlow Lite."""
    return personal.on_device("diagnostics/tflite", log)


def effects(params: Params, pre: Pretrained, runs: list[Run]) -> pd.DataFrame:
    """Each directional claim as a difference of accuracies (better minus worse run, positive =
    as the thesis says), paired bootstrap over test samples and seeds, three-way verdict."""
    by = {}
    for r in runs:
        by.setdefault(r.name, []).append(r)
    seeds, paper = len(params.seed_list), {n.quantity: n.value for n in PAPER.numbers}

    def correct(name, part):
        if name in pre.correct:
            return np.stack([pre.correct[name][part]] * seeds)
        return np.stack([r.scores[part] for r in sorted(by[name], key=lambda r: r.seed)])

    g, lf, fc, g0 = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True), label(0.0)
    lo, hi = label(params.alpha, min(params.ns)), label(params.alpha, max(params.ns))
    drop = paper["global accuracy drop, GDM(0)"]
    lf_gain = paper["global accuracy loss vs baseline, GDM"] - paper["global accuracy loss vs baseline, GDM+LF"]
    fmc_global, fmc_local = paper["global accuracy change, FMC vs LF"], paper["local accuracy change, FMC vs LF"]
    claimed = [  # (claim, test set, better, worse, the thesis's change)
        (f"GDM(0) forgets the global classes ({g0} below the pre-trained model)", "global", "pre-trained", g0, drop),
        (f"mixing global data forgets less ({g} above {g0})", "global", g, g0, math.nan),
        (f"LF preserves global accuracy ({lf} above {g})", "global", lf, g, lf_gain),
        (f"more frozen layers keep more global accuracy ({lo} above {hi})", "global", lo, hi, math.nan),
        (f"FMC changes no global accuracy ({fc} vs {lf}; the thesis: none)", "global", fc, lf, fmc_global),
        (f"FMC changes no local accuracy ({fc} vs {lf}; the thesis: none)", "local", fc, lf, fmc_local),
    ]
    rng = streams.rng(params.seed, "moil_image/bootstrap")
    table = []
    for claim, part, better, worse, change in claimed:
        b, w = correct(better, part), correct(worse, part)
        row = {"effect": claim, "test set": part, "paper change": change}
        row.update(report.accuracy_difference(b, w, rng, params.bootstrap))
        table.append({**row, "test samples": b.shape[1], "seeds": b.shape[0]})
    return pd.DataFrame(table)


def verdict_text(effects_table: pd.DataFrame, stand_in: str | None = STAND_IN) -> str:
    """The effects as Markdown bullets, in percentage points of accuracy."""
    return report.accuracy_verdicts(effects_table, stand_in)


def conclude(
    params: Params,
    data: Data,
    pre: Pretrained,
    runs: list[Run],
    time_table: pd.DataFrame,
    size_table: pd.DataFrame,
    on_device_table,
    flatbuffer,
    wall_time_s: float,
) -> record.Result:
    """Tables, headline numbers over seeds, the thesis's numbers beside ours, effects."""
    final = pd.DataFrame([report.final_row(r, params.epochs) for r in runs])
    g, lf, fc, g0 = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True), label(0.0)
    per = lambda run, col: final[final.run == run].sort_values("seed")[col].to_numpy()
    base_global = float(pre.correct["baseline"]["global"].mean())
    pre_global = float(pre.correct["pre-trained"]["global"].mean())
    c = Conclusion(NAME, params, PAPER)
    c.headlines(
        {
            "global accuracy loss vs baseline, GDM": base_global - per(g, "global_accuracy"),
            "global accuracy loss vs baseline, GDM+LF": base_global - per(lf, "global_accuracy"),
            "local accuracy, GDM+LF": per(lf, "local_accuracy"),
            "global accuracy drop, GDM(0)": pre_global - per(g0, "global_accuracy"),
        }
    )
    at_224 = size_table[size_table.input == "224x224x3"]
    ours = {
        "global accuracy change, FMC vs LF": float((per(fc, "global_accuracy") - per(lf, "global_accuracy")).mean()),
        "local accuracy change, FMC vs LF": float((per(fc, "local_accuracy") - per(lf, "local_accuracy")).mean()),
        "cached feature bytes per sample": float(size_table["cached bytes per sample"].iloc[0]),
        "raw / cached bytes per sample": float(size_table["raw / cached"].iloc[0]),
        "raw / cached bytes per sample at 224x224x3": float(at_224["raw / cached"].iloc[0])
        if len(at_224)
        else float("nan"),
    }
    drop = () if len(at_224) else ("raw / cached bytes per sample at 224x224x3",)
    c.paper_vs_ours(ours, _our_setting(params), drop)
    c.effect_rows(effects(params, pre, runs))
    tables = {
        "data": data.table(),
        "pretraining": pre.history(),
        "pretraining_cache": pre.cache(),
        "history": history_table(pre, runs),
        "final": final,
        "timing": time_table,
        "speedups_time": report.speedups(params, time_table, PAPER_TIME),
        "benchmark_time": step_times(params, runs),
        "timing_effects": report.image_timing_effects(params, runs, time_table, PAPER_TIME),
        "fmc_vs_lf": fmc_vs_lf(runs, params),
        "cache_size": size_table,
    }
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    speedup = tables["speedups_time"]
    return c.result(
        tables,
        data.sources,
        data.stand_in,
        wall_time_s,
        models={f"moil_mobilenet_v2_lf{params.n}_trainable.tflite": flatbuffer} if flatbuffer else {},
        seeds=params.seed_list,
        pretrained_global_accuracy=pre_global,
        baseline_global_accuracy=base_global,
        baseline_local_accuracy=float(pre.correct["baseline"]["local"].mean()),
        models_from_cache={k: e.hit for k, e in pre.entries.items()},
        **{"speedups (volatile)": dict(zip(speedup["speed-up"], speedup["our time ratio"]))},
        tflite_max_output_difference=None
        if on_device_table is None
        else on_device_table.attrs["max_output_difference"],
    )


def _our_setting(params: Params) -> dict:
    g, lf = label(params.alpha), label(params.alpha, params.n)
    return {
        "global accuracy loss vs baseline, GDM": g,
        "global accuracy loss vs baseline, GDM+LF": lf,
        "global accuracy change, FMC vs LF": f"{lf}+FMC vs {lf}",
        "local accuracy change, FMC vs LF": f"{lf}+FMC vs {lf}",
        "local accuracy, GDM+LF": lf,
        "global accuracy drop, GDM(0)": f"pre-trained - GDM(0) after {params.epochs} epochs",
        "cached feature bytes per sample": f"LF({params.n}) at "
        f"{params.image_size}x{params.image_size}, width {params.width}",
        "raw / cached bytes per sample": f"{params.image_size}x{params.image_size}x3 float32 input",
        "raw / cached bytes per sample at 224x224x3": "MobileNetV2 1.0, 224x224x3, LF(1)"
        if params.n == 1
        else f"LF({params.n})",
    }


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load_data(params, log)
    pre = pretrain(params, data, log)
    personal = Personalizer(params, data, pre)
    runs = gdm_sweep(params, personal, log) + lf_sweep(params, personal, log) + fmc(params, personal, log)
    time_table = timing(params, data, personal, runs, log)
    size_table = cache_size(params, data, pre, log)
    table, flatbuffer = on_device(params, personal, log)
    return conclude(params, data, pre, runs, time_table, size_table, table, flatbuffer, time.perf_counter() - start)


def plot_figure(history: pd.DataFrame, time_table: pd.DataFrame, runs: list[str], title: str):
    """Global and local accuracy per epoch, and total training time (as Fig. 5.3/5.5/5.7)."""
    seconds = time_table.set_index("run").training_time_seconds
    return report.plot_runs(history, runs, seconds, "accuracy", PANELS, title)


def plot_benchmark(bench: pd.DataFrame):
    """Steady step time of full training, head with forward pass, head from cache, with ratios."""
    return report.plot_step_times(
        bench.training, bench["steady step seconds"], "Benchmark: one training step, same run"
    )
