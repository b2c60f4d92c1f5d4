"""One module per notebook: the stages of notebooks/<paper>/<name>.ipynb and its report."""
