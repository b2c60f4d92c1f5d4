"""What runs on the phone: the trainable TFLite export and its interpreter runner (later energy
and latency meters)."""
