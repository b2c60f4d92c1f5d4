"""AutLearn's techniques and baselines, one module each: `fedavg` (the federated baseline), `eda` and
`image_augment` (data augmentation), `pruning` (the cloud's structured pruning) and
`magnitude_pruning` (its unstructured alternative), `compiler` (the compiled training step). The
on-device step itself (last layer only), bucketing, the inference cache and the SVD compression are
DeepType's modules, the same methods (see `protocol`)."""
