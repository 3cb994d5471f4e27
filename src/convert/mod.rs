//! Official YOLOv9 PyTorch checkpoints (`.pt`) → safetensors, parsed without Python.
