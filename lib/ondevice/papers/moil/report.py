"""MoIL's tables and figures for both notebooks: speed-ups judged on timed steps, the image
experiment's accuracy effects, FMC against LF without the cache, the audio cache's size, and the
curves and step-time figures of the thesis's Fig. 5.3-5.8."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data import audio_features, esc50
from ondevice.papers.moil.audio_data import AudioData
from ondevice.papers.moil.protocol import Run, label


def speedup(slow: np.ndarray, fast: np.ndarray, rng, n_boot: int, slow_time=None, fast_time=None) -> dict:
    """The ratio of two configurations' training times (slower / faster: above 1 is faster), each
    time a function of the median of its timed steps (default: the median itself), with a 95%
    bootstrap interval resampling each one's steps independently (steps of different runs are not
    paired) and a verdict: holds when the interval lies above 1."""
    slow_time, fast_time = slow_time or (lambda m: m), fast_time or (lambda m: m)
    ratio = float(slow_time(np.median(slow)) / fast_time(np.median(fast)))
    resampled = [x[rng.integers(0, len(x), (n_boot, len(x)))] for x in (slow, fast)]
    boot = slow_time(np.median(resampled[0], axis=-1)) / fast_time(np.median(resampled[1], axis=-1))
    low, high = (float(q) for q in np.quantile(boot, [0.025, 0.975]))
    return {
        "ratio": ratio,
        "low": low,
        "high": high,
        "verdict": "holds" if low > 1 else "does not hold" if high < 1 else "within noise",
    }


# ----------------------------------------------------------------------------------- images


def final_row(run: Run, epochs: int) -> dict:
    """A run of the image experiment as a row of its `final` table."""
    steps = epochs * run.steps_per_epoch
    return {
        "run": run.name,
        "alpha": run.alpha,
        "n": run.n or 0,
        "fmc": run.fmc,
        "seed": run.seed,
        "training_samples": run.samples,
        "steps": steps,
        "global_accuracy": float(run.scores["global"].mean()),
        "local_accuracy": float(run.scores["local"].mean()),
        "steady_step_seconds": run.steady_step_seconds,
        "cache_build_seconds": run.cache_seconds,
        "training_time_seconds": run.steady_step_seconds * steps + run.cache_seconds,
    }


def fmc_vs_lf(runs: list[Run], params) -> pd.DataFrame:
    """Per seed: FMC against LF(n) without the cache (same seed, data and batches): the largest
    weight difference after training and whether every test prediction agrees."""
    by = {(r.name, r.seed): r for r in runs}
    rows = []
    for s in params.seed_list:
        cached, plain = by[(label(params.alpha, params.n, True), s)], by[(label(params.alpha, params.n), s)]
        c, p = cached.scores, plain.scores
        rows.append(
            {
                "seed": s,
                "max |weight difference|": max(
                    float(np.abs(a - b).max()) for a, b in zip(cached.weights, plain.weights)
                ),
                "global predictions equal": bool(np.array_equal(c["global"], p["global"])),
                "local predictions equal": bool(np.array_equal(c["local"], p["local"])),
                "global accuracy, FMC": c["global"].mean(),
                "global accuracy, LF": p["global"].mean(),
                "local accuracy, FMC": c["local"].mean(),
                "local accuracy, LF": p["local"].mean(),
            }
        )
    return pd.DataFrame(rows)


def speedups(params, time_table: pd.DataFrame, paper_time: dict[str, float]) -> pd.DataFrame:
    """The thesis's speed-ups (ratios of training times) beside ours."""
    t = time_table.set_index("run").training_time_seconds
    g, lf, fc = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True)
    small = min(params.ns)
    large = 3 if 3 in params.ns and small < 3 else max(params.ns)  # the thesis's pair where the sweep has it
    ours = {
        "GDM vs baseline": t["baseline"] / t[g],
        "GDM+LF vs GDM": t[g] / t[lf],
        "GDM+LF+FMC vs GDM+LF": t[lf] / t[fc],
        "GDM+LF+FMC vs baseline": t["baseline"] / t[fc],
        "LF(1) vs LF(3)": t[label(params.alpha, large)] / t[label(params.alpha, small)],
    }
    names = {"LF(1) vs LF(3)": f"LF({small}) vs LF({large}) (thesis: LF(1) vs LF(3))"}
    return pd.DataFrame(
        [{"speed-up": names.get(k, k), "paper time ratio": paper_time[k], "our time ratio": v} for k, v in ours.items()]
    )


def step_times(params, runs: list[Run]) -> pd.DataFrame:
    """Steady step time of the same configuration three ways (median over seeds): full
    training, head-only with the forward pass (LF), head-only from the cache (FMC)."""
    steady = pd.DataFrame([final_row(r, params.epochs) for r in runs]).groupby("run").steady_step_seconds.median()
    ways = (
        ("full training (all layers)", label(params.alpha)),
        (f"head only, forward pass through the frozen part (LF({params.n}))", label(params.alpha, params.n)),
        (f"head only, from cached feature maps (LF({params.n})+FMC)", label(params.alpha, params.n, True)),
    )
    table = pd.DataFrame([{"training": w, "steady step seconds": steady[r]} for w, r in ways])
    table["time ratio full / this"] = table["steady step seconds"].iloc[0] / table["steady step seconds"]
    return table


def image_timing_effects(params, runs: list[Run], time_table: pd.DataFrame, paper_time: dict) -> pd.DataFrame:
    """Speed-up claims on training times (steps x median step time, + the caching pass), each
    configuration's timed steps pooled over seeds."""
    t = time_table.set_index("run")
    durations = {"baseline": time_table.attrs["baseline_step_seconds"]}
    for r in runs:
        durations[r.name] = np.concatenate([durations.get(r.name, np.zeros(0)), r.step_seconds])

    def total(name):  # a configuration's training time as a function of its median step time
        return lambda median: t.steps[name] * median + t.cache_build_seconds[name]

    g, lf, fc = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True)
    rng = streams.rng(params.seed, "moil_image/bootstrap/time")
    rows = []
    for claim, slow, fast, paper in (
        (f"GDM trains faster than the baseline ({g})", "baseline", g, "GDM vs baseline"),
        (f"LF trains faster than GDM alone ({lf})", g, lf, "GDM+LF vs GDM"),
        (f"FMC trains faster than LF without the cache ({fc})", lf, fc, "GDM+LF+FMC vs GDM+LF"),
    ):
        s = speedup(durations[slow], durations[fast], rng, params.bootstrap, total(slow), total(fast))
        rows.append(
            {
                "effect": claim,
                "paper time ratio": paper_time[paper],
                "our time ratio": s["ratio"],
                "ci low (time ratio)": s["low"],
                "ci high (time ratio)": s["high"],
                "steps timed": f"{len(durations[slow])} / {len(durations[fast])}",
                "verdict (time)": s["verdict"],
            }
        )
    return pd.DataFrame(rows)


def accuracy_difference(better: np.ndarray, worse: np.ndarray, rng, n_boot: int, level: float = 0.95) -> dict:
    """Difference of accuracies (better - worse), mean over seeds, with a paired bootstrap over
    test samples (the same resampled samples for both runs and every seed), then over seeds (as
    `claims.paired_effect` does)."""
    b, w = better.astype(float), worse.astype(float)  # (seeds, samples)
    change = float((b.mean(axis=1) - w.mean(axis=1)).mean())
    idx = rng.integers(0, b.shape[1], size=(n_boot, b.shape[1]))
    per_seed = b[:, idx].mean(axis=2) - w[:, idx].mean(axis=2)  # (seeds, n_boot)
    if len(b) > 1:
        per_seed = np.take_along_axis(per_seed, rng.integers(0, len(b), size=per_seed.shape), axis=0)
    boot = per_seed.mean(axis=0)
    low, high = (float(q) for q in np.quantile(boot, [(1 - level) / 2, (1 + level) / 2]))
    verdict = "holds" if low > 0 else "does not hold" if high < 0 else "within noise"
    return {"our change": change, "ci low": low, "ci high": high, "verdict": verdict, "level": level}


def accuracy_verdicts(effects_table: pd.DataFrame, stand_in: str | None) -> str:
    """A Markdown bullet per effect; changes are differences of accuracy in percentage points."""
    lines = []
    for _, r in effects_table.iterrows():
        paper = (
            "the thesis gives no number"
            if math.isnan(r["paper change"])
            else f"the thesis: {100 * r['paper change']:+.1f} points"
        )
        lines.append(
            f"- **{r['effect']}**: {r['verdict']}: {100 * r['our change']:+.1f} points ({r['level']:.0%} interval "
            f"{100 * r['ci low']:+.1f} to {100 * r['ci high']:+.1f}, {r['test samples']} {r['test set']} test "
            f"samples x {r['seeds']} seed(s); {paper})."
        )
    lines.append("- For the two FMC rows, *within noise* is what the thesis claims (no change).")
    if stand_in:
        lines.append(
            f"- Our data is **stand-in data** for {stand_in}. Absolute accuracies are not the thesis's; "
            "the direction and size of each effect are what we compare."
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- audio


def fmc_equality(cached: list[Run], lf: list[Run]) -> pd.DataFrame:
    """FMC vs LF without caching, epoch by epoch and seed by seed (same seed, same batches)."""
    tables = []
    for c, plain in zip(cached, lf):
        a, b = pd.DataFrame(c.history), pd.DataFrame(plain.history)
        difference = np.maximum((a.global_auc - b.global_auc).abs(), (a.local_auc - b.local_auc).abs())
        columns = {"seed": c.seed, "epoch": a.epoch, "global AUC, LF": b.global_auc, "global AUC, FMC": a.global_auc}
        columns |= {"local AUC, LF": b.local_auc, "local AUC, FMC": a.local_auc, "max |AUC difference|": difference}
        tables.append(pd.DataFrame(columns))
    return pd.concat(tables, ignore_index=True)


def cache_table(cached: Run, data: AudioData) -> pd.DataFrame:
    """M6: what FMC stores per clip against the raw waveform (float32 at 16 kHz, the thesis's
    625 KB per 10 s) and against the 16-bit 44.1 kHz file, scaled to 10 s as in footnote 6."""
    shape, per_patch = cached.cache["feature_shape"], cached.cache["cached_bytes_per_sample"]
    clip_seconds, raw_clip_bytes = data.clip_seconds, data.raw_clip_bytes
    per_clip = audio_features.patches_per_clip(int(round(clip_seconds * esc50.SAMPLE_RATE)))
    per10 = audio_features.patches_per_clip(10 * esc50.SAMPLE_RATE)
    clip, ten, raw10 = f"{clip_seconds:g} s clip", "10 s of audio", 10 * esc50.SAMPLE_RATE * 4
    table = pd.DataFrame(
        [
            {
                "what": "feature-map cache (our clip)",
                "per": clip,
                "shape": f"{per_clip} x {shape}",
                "bytes": per_clip * per_patch,
            },
            {"what": "raw waveform, float32 16 kHz", "per": clip, "shape": "", "bytes": raw_clip_bytes},
            {
                "what": "raw file, int16 44.1 kHz",
                "per": clip,
                "shape": "",
                "bytes": int(round(clip_seconds * 44100)) * 2,
            },
            {"what": "feature-map cache", "per": ten, "shape": f"{per10} x {shape}", "bytes": per10 * per_patch},
            {"what": "raw waveform, float32 16 kHz", "per": ten, "shape": "", "bytes": raw10},
        ]
    )
    table["KB"] = table.bytes / 1024
    table["vs raw float32 waveform"] = table.bytes / np.where(table.per == ten, raw10, raw_clip_bytes)
    return table


def benchmark_ratios(bench: pd.DataFrame, n: int) -> dict[str, float]:
    """The printed ratios: head-only from cache vs with forward pass vs full training."""
    t = bench.set_index("configuration").steady_step_seconds
    full, head, cached = t["full training"], t["LF(1) with forward pass"], t["LF(1) from the cache (FMC)"]
    lf, lf_cached = t[f"LF({n}) with forward pass"], t[f"LF({n}) from the cache (FMC)"]
    return {
        "full training / head-only with forward pass (LF(1))": full / head,
        "head-only with forward pass / head-only from cache": head / cached,
        "full training / head-only from cache": full / cached,
        f"full training / LF({n})": full / lf,
        f"LF({n}) / LF({n}) from the cache": lf / lf_cached,
    }


def audio_timing_effects(params, bench: pd.DataFrame, paper_time: dict[str, float]) -> pd.DataFrame:
    """Speed-up claims on the benchmark's steady step times (one run)."""
    steps = bench.set_index("configuration").step_seconds
    lf, cached = f"LF({params.n}) with forward pass", f"LF({params.n}) from the cache (FMC)"
    rng = streams.rng(params.seed, "moil-audio/bootstrap/time")
    rows = []
    for claim, slow, fast in (
        ("LF(3) speed-up over full training", "full training", lf),
        ("FMC speed-up over LF(3) without the cache", lf, cached),
    ):
        s = speedup(np.asarray(steps[slow]), np.asarray(steps[fast]), rng, params.bootstrap)
        rows.append(
            {
                "effect": claim.replace("LF(3)", f"LF({params.n})"),
                "paper speed-up (time)": paper_time[claim],
                "our speed-up (time)": s["ratio"],
                "ci low (time)": s["low"],
                "ci high (time)": s["high"],
                "timed steps": len(steps[slow]),
                "verdict (time)": s["verdict"],
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- figures


def plot_runs(history: pd.DataFrame, names: list[str], seconds: pd.Series, metric: str, panels: tuple, title: str):
    """Fig. 5.3-5.8: the global and the local score (history columns `<set>_<metric>`) per epoch of
    each run, mean over seeds, titled `panels`, and each run's training time on this machine."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    h = history[history.run.isin(names)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for ax, part, panel in zip(axes, ("global", "local"), panels):
        sns.lineplot(
            data=h, x="epoch", y=f"{part}_{metric}", hue="run", hue_order=names, marker="o", errorbar=None, ax=ax
        )
        ax.set(title=panel, ylabel={"auc": "AUC"}.get(metric, metric))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(title="", fontsize=8, frameon=False)
    shown = seconds.reindex([r for r in names if r in seconds.index])
    axes[2].barh(range(len(shown)), shown.to_numpy(), color="#d1495b")
    axes[2].set_yticks(range(len(shown)), shown.index)
    axes[2].invert_yaxis()
    axes[2].set(title="(c) total training time (this machine)", xscale="log", xlabel="seconds (log)")
    fig.suptitle(title)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_convergence(history: pd.DataFrame, cache: pd.DataFrame):
    """The baseline's held-out loss per epoch (the stopping rule's curve, its kept epoch marked) and
    both models' test accuracies per epoch (shown, never used to stop)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    base, kept = history[history.run == "baseline"], cache.set_index("model").kept_epoch["baseline"]
    axes[0].plot(base.epoch, base.holdout_loss, marker="o", color="#30638e")
    axes[0].axvline(kept, color="#d1495b", linestyle="--", label=f"kept epoch {kept}")
    axes[0].set(title="baseline: loss on its held-out training images", xlabel="epoch", ylabel="cross-entropy")
    long = history.melt(["epoch", "run"], ["global_accuracy", "local_accuracy"], "test set", "accuracy")
    sns.lineplot(data=long, x="epoch", y="accuracy", hue="run", style="test set", marker="o", ax=axes[1])
    axes[1].set(title="test accuracy per epoch (not used to stop)")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8, frameon=False)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_step_times(names: list[str], seconds: np.ndarray, title: str):
    """Steady-state milliseconds per training step of each configuration, measured in one run,
    each with its speed-up over the first (full training)."""
    import matplotlib.pyplot as plt

    ms = 1000 * np.asarray(seconds)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(ms)))
    ax.barh(range(len(ms)), ms, color=["#8c8c8c"] + ["#d1495b"] * (len(ms) - 1))
    ax.set_yticks(range(len(ms)), names)
    ax.invert_yaxis()
    for i, t in enumerate(ms):
        text = f"{t:.1f} ms, {ms[0] / t:.1f}x faster than full" if i else f"{t:.1f} ms"
        ax.annotate(text, (t, i), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set(xlabel="steady-state milliseconds per step (median after warm-up)", title=title)
    ax.set_xlim(0, ax.get_xlim()[1] * 1.6)
    fig.tight_layout()
    return fig


def plot_speedups(table: pd.DataFrame, timing_effects_table: pd.DataFrame):
    """The thesis's speed-ups (black marks) beside ours (bars, with the bootstrap interval and
    the verdict where the speed-up is a judged claim), log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3))
    y = np.arange(len(table))
    ax.barh(y, table["our time ratio"], color="#d1495b", label="ours (this machine)")
    judged = timing_effects_table.reset_index(drop=True)  # the first rows of `table`, in the same order
    ratio = judged["our time ratio"]
    ax.errorbar(
        ratio,
        y[: len(judged)],
        xerr=[ratio - judged["ci low (time ratio)"], judged["ci high (time ratio)"] - ratio],
        fmt="none",
        color="0.2",
        capsize=3,
    )
    for i, verdict in enumerate(judged["verdict (time)"]):
        ax.annotate(
            verdict, (table["our time ratio"].iloc[i], i), xytext=(6, -9), textcoords="offset points", fontsize=8
        )
    ax.scatter(table["paper time ratio"], y, color="black", marker="|", s=250, label="thesis (Galaxy S21)", zorder=3)
    ax.set_yticks(y, table["speed-up"])
    ax.invert_yaxis()
    ax.axvline(1, color="0.6", lw=1, ls="--")
    ax.set(
        xscale="log", xlabel="speed-up (ratio of training times, log)", title="Speed-ups, thesis vs ours, with verdicts"
    )
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
