"""Stand-ins for GPU vendor libraries, for unit tests on machines without GPUs.

These are NOT the vendor libraries. ``fake_nvml`` mirrors the names, constants, exception classes and
return shapes of nvidia-ml-py (``pynvml``) 13.x; ``fake_amdsmi`` mirrors amdsmi 7.0.x. Both are driven
by scripted per-device values. They are injected at the one boundary the backends offer
(``NvidiaBackend(nvml=...)``, ``AmdBackend(amdsmi=...)``) and nowhere else.
"""
