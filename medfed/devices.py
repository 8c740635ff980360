"""The devices a run may be asked to train or serve on, as the settings spell them: shared by
the settings (which check a choice) and the device setup (which acts on it)."""

from __future__ import annotations

# cpu-bf16: the CPU with the GPU path's numerics (bf16 autocast, channels-last), for checking
# that path on a machine without a GPU (medfed gpu-check); slower than cpu on most CPUs.
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "cpu-bf16")
