"""Data: manifests (declared, verified data sets), loaders per format, per-user splits."""
