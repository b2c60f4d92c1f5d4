"""One module per notebook: a Params dataclass with presets, PAPER numbers, and run()."""
