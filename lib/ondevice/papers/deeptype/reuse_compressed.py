"""Reuse of inference results where DeepType measures it (Sec. 5.6, Fig. 6, Sec. 6.2.3): online
training runs on the combined compressed model, the SVD global model at the rule's rank
(re-trained in the cloud, `techniques/svd_rank.py`) cut on the phone to the user's own words
(vocabulary compression), fine-tuned. The model is built by `techniques/combined.py`'s "all
combined" variant, the same one Table 2 trains. With a factored softmax, fine-tuning trains its
t x V' `softmax` only, so reuse caches the projection's output and the update skips the LSTMs and
the projection; the work counts are `training.inference_reuse`'s with that rank and vocabulary.
The uncompressed model's counts stand beside them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ondevice.device.device_profile import extrapolate_seconds, load_device_profile
from ondevice.papers.deeptype import common, protocol
from ondevice.papers.deeptype.techniques import combined, svd_rank
from ondevice.papers.deeptype.techniques.vocab_compression import VocabMap
from ondevice.tasks import typing_protocol
from ondevice.training import inference_reuse

UNCOMPRESSED, COMPRESSED = "uncompressed", "combined compressed"


def compress_global(params, corpus, models, log=print):
    """The SVD global models at the rule's rank (`svd_rank.compress`; cached, shared with D6)."""
    return svd_rank.compress(params, corpus, models, log)


def user_model(params, corpus, models, compressed, user: str, seed: int):
    """(combined compressed model of `user` with its starting weights set, its vocabulary map)."""
    train, test = corpus.personal(user, params.personal_train_fraction)
    model, _, _, _, vmap = combined.VARIANTS["combined"].for_seed(models, compressed, seed, train, test)
    return model, vmap


def config(params, corpus, kept: int = 0):
    """The LSTM's config (`typing_protocol.model_config`), its softmax cut to `kept` words if > 0."""
    full = typing_protocol.model_config(params, corpus)
    return replace(full, output_vocab=kept) if kept else full


def reuse_check(online, start, x, y) -> tuple[float, float]:
    """(max |difference| of the head's weights after one fine-tune step and one reuse step on the
    same batch from `start`, the largest weight change of the step, for scale)."""
    online.reset(start)
    online.train(x, y)
    plain = online.head_weights()
    online.reset(start)
    online.train_from_cache(online.infer_and_cache(x)["features"], y)
    diff = lambda a, b: max(float(np.abs(np.asarray(p) - np.asarray(q)).max()) for p, q in zip(a, b))  # noqa: E731
    heads = len(plain)
    return diff(plain, online.head_weights()), diff(plain, start[-heads:])


def compressed_check(params, corpus, models, compressed) -> tuple[float, float]:
    """`reuse_check` on the first test user's combined compressed model (its own words' labels)."""
    user = corpus.split.test[0]
    model, vmap = user_model(params, corpus, models, compressed, user, params.seed)
    online = protocol.online_trainer(params, model, common.task(params), reuse=True)
    train = vmap.remap(corpus.personal(user, params.personal_train_fraction)[0])
    x, y = protocol.online_batches(train, params.online_batch_size)[0]
    return reuse_check(online, model.get_weights(), x, y)


def work_per_user(params, corpus, rank: int) -> pd.DataFrame:
    """Analytic FLOPs of one online update, averaged over each test user's real online batches
    (their typing in order, 16 samples a batch), without and with reuse, on the uncompressed model
    and on the combined compressed one (rank `rank`, the user's own words). Deterministic."""
    rows, flops = [], inference_reuse.flops_per_update
    for seed in params.seed_list:
        for user in corpus.split.test:
            train = corpus.personal(user, params.personal_train_fraction)[0]
            lengths = [x.shape[1] for x, _ in protocol.online_batches(train, params.online_batch_size)]
            kept = VocabMap.from_history(train, corpus.vocab.size).size
            for model, cfg, r in (
                (UNCOMPRESSED, config(params, corpus), 0),
                (COMPRESSED, config(params, corpus, kept), rank),
            ):
                cost = [[flops(cfg, params.online_batch_size, n, reuse, r) for n in lengths] for reuse in (False, True)]
                row = (model, seed, user, len(lengths), np.mean(lengths), cfg.output_vocab, r)
                rows.append(row + (np.mean(cost[0]) / 1e6, np.mean(cost[1]) / 1e6))
    columns = ["model", "seed", "user", "online_batches", "mean_length", "output_words", "rank"]
    table = pd.DataFrame(rows, columns=columns + ["mflops_without_reuse", "mflops_with_reuse"])
    return table.assign(ratio=table.mflops_without_reuse / table.mflops_with_reuse)


def device_extrapolation(params, work: pd.DataFrame) -> pd.DataFrame | None:
    """With a device profile: each test user's online training (all their batches) on that device,
    extrapolated from the profile's steady step time, scaled by sequence length."""
    if not params.device_profile:
        return None
    profile = load_device_profile(params.device_profile)
    rows = []
    for r in work[(work.seed == params.seed) & (work.model == UNCOMPRESSED)].itertuples():
        e = extrapolate_seconds(profile, r.online_batches, r.mean_length)
        rows.append((r.user, e["device"], e["variant"], r.online_batches, e["step_seconds"], e["seconds"], e["label"]))
    columns = ["device", "variant", "online_batches", "extrapolated_step_seconds", "extrapolated_seconds", "label"]
    return pd.DataFrame(rows, columns=["user", *columns])
