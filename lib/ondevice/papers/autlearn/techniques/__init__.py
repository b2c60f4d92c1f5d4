"""AutLearn's techniques and baselines, one module each: `fedavg` (the federated baseline), `eda` and
`image_augment` (data augmentation), `pruning` (the cloud's structured pruning) and
`magnitude_pruning` (its unstructured alternative), `compiler` (the compiled training step). The
on-device step itself (last layer only: `training.fine_tune`), bucketing (`training.bucketing`), the
inference cache (`training.inference_reuse`) and the SVD compression (`models.svd_compression`) are
shared with DeepType, the same methods (see `protocol`, `online_learning` and `compression`)."""
