"""Model grouping (Colla Sec. 3.2): the cloud clusters the client models by what they predict on
the cloud's data, with Affinity Propagation, and trains one cloud model per group.

The distance of two client models is the cross-entropy between their (zero-padded) output
vectors, averaged over the cloud samples and symmetrised (CE is not symmetric; silhouettes need a
zero diagonal, so a model's distance to itself is 0). Affinity Propagation chooses its number of
clusters through its `preference`; for each K of {2, 3, 5, 10} (those below the number of
clients) a bisection on the preference looks for exactly K clusters, and the K with the highest
silhouette coefficient wins, the paper's brute-force choice.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from sklearn.cluster import AffinityPropagation
from sklearn.metrics import silhouette_score

EPS = 1e-7  # keeps log(0) of zero-padded outputs finite


def output_distances(ensemble, cloud_x: np.ndarray, clients: int, batch_size: int = 256) -> np.ndarray:
    """[clients, clients] symmetrised cross-entropy of the clients' outputs on the cloud data."""
    ce = np.zeros((clients, clients))
    for i in range(0, len(cloud_x), batch_size):
        p = ensemble.padded(cloud_x[i : i + batch_size]).numpy()[:clients]  # [clients, batch, places]
        ce += -np.einsum("ibv,jbv->ij", p, np.log(p + EPS))
    ce /= len(cloud_x)
    d = (ce + ce.T) / 2
    np.fill_diagonal(d, 0.0)
    return d


def _ap(similarity: np.ndarray, preference: float, seed: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not converge": its labels are still a clustering
        ap = AffinityPropagation(affinity="precomputed", preference=preference, random_state=seed, max_iter=500)
        return ap.fit_predict(similarity)


def clusters_of_size(distances: np.ndarray, k: int, seed: int, steps: int = 40) -> np.ndarray | None:
    """Affinity Propagation labels with exactly k clusters, or None if the bisection finds none."""
    similarity = -distances
    lo, hi = 2 * similarity.min(), 0.0  # few clusters ... one per client
    for _ in range(steps):
        mid = (lo + hi) / 2
        labels = _ap(similarity, mid, seed)
        found = len(np.unique(labels))
        if found == k and labels.min() >= 0:
            return labels
        lo, hi = (mid, hi) if found < k else (lo, mid)
    return None


def choose_groups(distances: np.ndarray, candidates=(2, 3, 5, 10), seed: int = 0) -> tuple[np.ndarray, pd.DataFrame]:
    """Labels of the best K by silhouette, and a table of every candidate tried. With fewer than
    three clients (or no K reachable) everyone is in one group."""
    n = len(distances)
    rows, best = [], (None, -np.inf)
    for k in candidates:
        if not 2 <= k < n:
            rows.append({"K": k, "reached": False, "silhouette": float("nan")})
            continue
        labels = clusters_of_size(distances, k, seed)
        score = float(silhouette_score(distances, labels, metric="precomputed")) if labels is not None else float("nan")
        rows.append({"K": k, "reached": labels is not None, "silhouette": score})
        if labels is not None and score > best[1]:
            best = (labels, score)
    table = pd.DataFrame(rows)
    table["chosen"] = False
    if best[0] is None:
        return np.zeros(n, int), table
    labels = np.unique(best[0], return_inverse=True)[1]
    table.loc[table.K == len(np.unique(labels)), "chosen"] = True
    return labels, table
