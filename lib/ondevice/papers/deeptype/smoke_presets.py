"""DeepType's smoke presets: what an experiment changes at `smoke` (CI and `make test`), its default
and paper presets staying in its module. No committed result is made at smoke, so this module is
code of smoke results only (`report.provenance.SMOKE_PRESETS`): a smoke run is trimmed here without
making a default result stale. Only an experiment's "smoke" preset entry reads it."""

# deeptype_top3eff: two personal epochs, two seeds, the far model's planted control at its fixed dose only
DEEPTYPE_TOP3EFF = dict(personal_epochs=2, seeds=2, tflite_check_steps=3, planted_far_doses=(0.0, 0.5))

# deeptype_top3eff_sensitivity: two personal epochs, one candidate per optimizer, two seeds
DEEPTYPE_TOP3EFF_SENSITIVITY = dict(personal_epochs=2, sgd_lr_grid=(1.0,), adam_lr_grid=(1e-3,), seeds=2)

# deeptype_top3eff_global_sensitivity: two personal epochs, two seeds
DEEPTYPE_TOP3EFF_GLOBAL_SENSITIVITY = dict(personal_epochs=2, seeds=2)
