"""cgc's GPU data plane: device communicators, tensor headers, streams, transport binding.

Nothing here imports cupy, NCCL or CUDA at import time; each module loads them when used.
See ``cgc.runtime.gpu.api`` notes in each module docstring.
"""
