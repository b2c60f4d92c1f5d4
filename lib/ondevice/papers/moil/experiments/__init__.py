"""The moil experiments: one module per notebook (stages the notebook calls, and its report)."""
