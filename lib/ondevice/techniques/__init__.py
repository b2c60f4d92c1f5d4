"""Techniques, one module each, grouped by the paper that introduced them
(`techniques/<paper>/<technique>.py`). Each is a model transform, a batch source or a training
hook (`training.trainer.Hook`), so "combined" rows compose the same code."""
