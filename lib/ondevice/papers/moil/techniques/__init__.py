"""MoIL (Fan, 2022, Ch. 4): on-device incremental training made affordable by global dataset
mixing (`gdm`), layer freezing (`layer_freezing`) and feature-map caching (`feature_cache`).
Each is independent of the model: a model module supplies `units(model)`, the model's "layers"
as the thesis counts them, and the same three modules serve MobileNetV2 and YAMNet."""
