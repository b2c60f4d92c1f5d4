"""One folder per paper: `paper.toml` (the paper's numbers and citation, as data), `common.py`
(the paper's data and model plumbing and its presets), `techniques/` (one module per technique
the paper introduced) and `experiments/` (one module per notebook: stages and a report).

Papers build on the shared packages (data, models, tasks, training, device, report, engine);
nothing outside `papers/` imports from here."""
