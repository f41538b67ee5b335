"""cgc's GPU helpers in each actor: streams and events, tensor headers, CUDA-graph replay.

Communicators that move device values (NCCL, CUDA IPC, host staging) are in
``cgc.runtime.comm``. Nothing here imports cupy or CUDA when the package is imported.

Modules (each docstring has the details and an example):

- ``streams``     - ``ActorStreams``: compute/comm streams, events, buffer lifetimes, the
  sync counter.
- ``tensors``     - split a value into a header and its device tensors, and back.
- ``cuda_graphs`` - capture a call once and replay it per execution
  (``Program.captured_ops``).
- ``polling``     - ``poll_until``: the back-off poll of a device query (an event, NCCL's
  async state) until done or a deadline.
"""
