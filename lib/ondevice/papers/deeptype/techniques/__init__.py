"""DeepType (Xu et al., IMWUT 2018) techniques."""
