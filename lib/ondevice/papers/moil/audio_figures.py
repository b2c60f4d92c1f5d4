"""MoIL audio's figures (thesis Fig. 5.4, 5.6, 5.8): AUC per epoch beside training time, and the
step-time benchmark; kept apart from the experiment's stages."""

from __future__ import annotations

import pandas as pd

from ondevice.papers.moil import report

PANELS = ("(a) global AUC (held-out classes)", "(b) local AUC (user's validation clips)")  # titles of the curves


def plot_overall(params, runs: pd.DataFrame, history: pd.DataFrame, bench: pd.DataFrame):
    """Fig. 5.4: GDM(alpha), + LF(n), + FMC: AUC per epoch and training time (from the benchmark)."""
    a, n = params.alpha, params.n
    names = [f"GDM({a:g})", f"GDM({a:g}) + LF({n})", f"GDM({a:g}) + LF({n}) + FMC"]
    t = bench.set_index("configuration")["training_time_seconds (epochs x steps x step)"]
    seconds = t[["full training", f"LF({n}) with forward pass", f"LF({n}) from the cache (FMC)"]].set_axis(names)
    return _plot(history, names, seconds, "Personalising YAMNet (cf. thesis Fig. 5.4)")


def plot_sweep(runs: pd.DataFrame, history: pd.DataFrame, names: list[str], title: str):
    """Fig. 5.6 / 5.8: one curve per alpha or per n, and each run's training time."""
    return _plot(history, names, runs.set_index("run").training_time_seconds, title)


def _plot(history: pd.DataFrame, names: list[str], seconds: pd.Series, title: str):
    names = list(dict.fromkeys(names))  # one curve per configuration, mean over seeds
    return report.plot_runs(history, names, seconds.groupby(level=0).median(), "auc", PANELS, title)


def plot_benchmark(bench: pd.DataFrame):
    """Step time: full training, layer freezing, feature-map caching."""
    return report.plot_step_times(bench.configuration, bench.steady_step_seconds, "Step time in one run")
