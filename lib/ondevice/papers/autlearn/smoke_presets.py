"""AutLearn's smoke presets: what an experiment changes at `smoke` (CI and `make test`), its default
and paper presets staying in its module. No committed result is made at smoke, so this module is
code of smoke results only (`report.provenance.SMOKE_PRESETS`): a smoke run is trimmed here without
making a default result stale. Only an experiment's "smoke" preset entry reads it."""

# autlearn_accuracy: few rounds and epochs, 2 clients a round, one MobileNet FedAvg rate, screens as the
# default has them (the smoke run takes the screens' path, not every candidate to its plateau)
AUTLEARN_ACCURACY = (
    dict(text_cloud_epochs=20, image_cloud_epochs=20, image_cloud_learning_rate=0.002, bootstrap=300)
    | dict(fedavg_rounds=80, image_fedavg_rounds=160, fedavg_clients=2, fedavg_epoch_candidates=(1, 2))
    | dict(text_fedavg_rate_candidates=(0.3, 1.0), image_fedavg_rate_candidates=(0.1,), image_rate_cuts=1)
    | dict(image_cloud_patience=4, image_sgd_rate_candidates=(0.03, 0.3), text_fedavg_screen_rounds=4)
    | dict(image_fedavg_screen_rounds=16, text_cloud_screen_epochs=2, image_cloud_screen_epochs=3)
)
