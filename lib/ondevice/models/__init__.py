"""Plain Keras model builders, one file per architecture."""
