"""AutLearn (autonomous on-device learning) techniques and baselines, one module each: `fedavg`
(the federated baseline of A2), `eda` and `image_augment` (A3), `pruning` (A5's cloud-side
compression). AutLearn's own on-device step (last layer only) is DeepType's FineTune hook, used
through `experiments.autlearn_common`; CloudTrain and CloudCustomize need nothing beyond the
Trainer; online learning reuses DeepType's `inference_reuse`."""
