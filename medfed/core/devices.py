"""The devices a run may be asked to train or serve on, as the settings spell them: shared by
the settings (which check a choice) and the device setup (which acts on it)."""

from __future__ import annotations

# cpu-bf16: the CPU with the GPU path's numerics (bf16 autocast, channels-last), for checking
# that path on a machine without a GPU (medfed gpu-check); slower than cpu on most CPUs.
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "cpu-bf16")

# The number format local training runs in: auto (bf16 where the device has it, fp16 with a
# gradient scaler on a CUDA device without it, float32 on a plain CPU), or one of them forced.
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
