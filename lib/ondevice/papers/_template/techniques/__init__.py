"""One module per technique of the paper: a model transform, a batch source or a training Hook."""
