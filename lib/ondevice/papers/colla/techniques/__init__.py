"""Colla (cloud-device collaborative learning for behaviour prediction) techniques: dual
distillation (client side), cloud update from client outputs, model grouping, and the explicit
device/cloud boundary across which only model parameters and model outputs travel."""
