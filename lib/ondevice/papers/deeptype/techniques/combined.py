"""DeepType's four on-device optimisations composed (Table 2): each personal-training variant is a
choice of softmax (full, or SVD-compressed, Sec. 5.1), of output vocabulary (global, or the user's
own words, Sec. 5.2), of trained layers (all, or the softmax only, Sec. 5.4) and of batch source
(fixed buckets, equal lengths, or the task's, Sec. 5.3). "All combined" is every choice at once,
built from the same transforms and hooks as each one alone.

The baseline is Table 2's personal model "without any on-device optimization" (Sec. 6.2.2), so its
batches are Sec. 5.3's naive solution without bucketing: every batch padded (or cut) to a fixed
length, 30; each technique alone keeps that batching, bucketing and all combined replace it with
equal-length batches. The suite's own batching (sorted by length within windows of 50 batches,
`typing_samples`) and DeepType's 4 pre-training buckets are the comparison rows of Sec. 5.3."""

from __future__ import annotations

from dataclasses import dataclass

from ondevice.papers.deeptype.techniques import vocab_compression as vc
from ondevice.training import bucketing as bk
from ondevice.training.fine_tune import FineTune


@dataclass(frozen=True)
class Variant:
    label: str
    svd: bool = False  # start from the SVD-compressed global model
    vocab: bool = False  # cut the softmax to the user's words
    fine_tune: bool = False  # train the softmax only
    batches: str = ""  # "" (the task's) | equal | buckets | fixed

    def source(self, params):
        """The batch source (a hook; `params.buckets`, `params.fixed_length`), None for the task's."""
        if self.batches in ("buckets", "fixed"):
            return bk.FixedBuckets(tuple(params.buckets) if self.batches == "buckets" else (params.fixed_length,))
        return bk.EqualLength() if self.batches == "equal" else None

    def hooks(self, params) -> list:
        return [h for h in (FineTune() if self.fine_tune else None, self.source(params)) if h is not None]

    def batch_list(self, task, data, params, rng) -> list:
        """The batches of one epoch at `params.personal_batch_size`, as the variant's trainer sees them."""
        hook, size = self.source(params), params.personal_batch_size
        source = hook.batches(task, data, size, rng) if hook else None
        return list(source if source is not None else task.batches(data, size, rng))

    def for_seed(self, models, compressed, seed: int, train, test):
        """`model` from one seed's global model (`common.GlobalModels`) and SVD global model
        (`svd_retrain.Compressed`; None for a variant without SVD)."""
        svd = (compressed.model, compressed.weights[seed]) if compressed is not None else None
        return self.model((models.model, models.weights[seed]), svd, train, test)

    def model(self, full, compressed, train, test):
        """(model with its starting weights set, those weights, train, test, vocabulary map or None)
        from `full` / `compressed`: (Keras model, weights) pairs of the global and the SVD model."""
        base, weights = compressed if self.svd else full
        base.set_weights(weights)
        if not self.vocab:
            return base, weights, train, test, None
        vmap = vc.VocabMap.from_history(train, base.output_shape[-1])
        model = vc.compress(base, vmap)
        return model, model.get_weights(), vmap.remap(train), vmap.remap(test), vmap


VARIANTS = {
    "baseline": Variant("personal model (baseline)", batches="fixed"),
    "fine_tune": Variant("fine-tune training", fine_tune=True, batches="fixed"),
    "svd": Variant("layer compression (SVD)", svd=True, batches="fixed"),
    "vocab": Variant("vocabulary compression", vocab=True, batches="fixed"),
    "bucketing": Variant("fine-grained bucketing", batches="equal"),
    "combined": Variant("all combined", svd=True, vocab=True, fine_tune=True, batches="equal"),
    "buckets_4": Variant("4 buckets (5/10/20/30)", batches="buckets"),
    "windows": Variant("windows of 50 batches (the suite's batching)"),
}
