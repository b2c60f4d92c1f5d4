"""Training: one Trainer for every task (hooks let techniques in), the content-addressed cache
of trained global models, and hyper-parameter selection on validation users."""
