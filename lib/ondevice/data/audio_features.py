"""YAMNet's front end in TensorFlow ops: 16 kHz waveform -> log-mel spectrogram -> 0.96 s patches.

25 ms periodic-Hann windows every 10 ms (a 512-point FFT), magnitude spectrum, 64 mel bins from
125 to 7500 Hz (HTK mel scale), log(mel + 0.001); patches of 96 frames every 48 frames (0.48 s).
A waveform is zero-padded at the end to at least one patch and to a whole number of patch hops,
so a 5 s ESC-50 clip gives 10 patches and a 10 s AudioSet clip 20.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SAMPLE_RATE = 16000
WINDOW, HOP, FFT = 400, 160, 512  # 25 ms, 10 ms, next power of two
MEL_BINS, MEL_LOW_HZ, MEL_HIGH_HZ = 64, 125.0, 7500.0
LOG_OFFSET = 0.001
PATCH_FRAMES, PATCH_HOP_FRAMES = 96, 48  # 0.96 s patches every 0.48 s
PATCH_SAMPLES = (PATCH_FRAMES - 1) * HOP + WINDOW  # 15600: one patch, as yamnet.tflite takes it
PATCH_HOP_SAMPLES = PATCH_HOP_FRAMES * HOP


def padded_length(samples: int) -> int:
    """Samples after padding: at least one patch, then whole patch hops."""
    extra = max(0, samples - PATCH_SAMPLES)
    return PATCH_SAMPLES + -(-extra // PATCH_HOP_SAMPLES) * PATCH_HOP_SAMPLES


def patches_per_clip(samples: int) -> int:
    return 1 + (padded_length(samples) - PATCH_SAMPLES) // PATCH_HOP_SAMPLES


@tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
def log_mel(waveform: tf.Tensor) -> tf.Tensor:
    """[samples] -> [frames, 64] log-mel spectrogram (no padding)."""
    spectrum = tf.abs(tf.signal.stft(waveform, WINDOW, HOP, FFT, window_fn=tf.signal.hann_window))
    mel = tf.signal.linear_to_mel_weight_matrix(MEL_BINS, FFT // 2 + 1, SAMPLE_RATE, MEL_LOW_HZ, MEL_HIGH_HZ)
    return tf.math.log(tf.matmul(spectrum, mel) + LOG_OFFSET)


def patches(waveform: np.ndarray) -> np.ndarray:
    """[samples] float waveform at 16 kHz in [-1, 1] -> [patches, 96, 64] float32."""
    waveform = np.asarray(waveform, np.float32)
    if waveform.ndim != 1 or not len(waveform):
        raise ValueError(f"expected a non-empty 1-D waveform, got shape {waveform.shape}")
    padded = np.pad(waveform, (0, padded_length(len(waveform)) - len(waveform)))
    return tf.signal.frame(log_mel(padded), PATCH_FRAMES, PATCH_HOP_FRAMES, axis=0).numpy()


def clip_patches(waveforms: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Patches of every clip, stacked, and the clip index of each patch."""
    per_clip = [patches(w) for w in waveforms]
    clip = np.concatenate([np.full(len(p), i) for i, p in enumerate(per_clip)])
    return np.concatenate(per_clip), clip
