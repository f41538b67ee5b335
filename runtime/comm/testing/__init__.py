"""Test stand-ins for the communicators: what CI runs instead of a GPU, NCCL or a second host.

Nothing in the product imports this package by default. A product module imports one of
its modules only when a test switch is on (the environment variables named in
``cgc.runtime.comm.binding``), inside the call that needs it; the modules live in the
installed package, not in ``tests/``, because Ray actor processes import them too.

- ``cpu_transport``  - ``ShmCpuTransport``: the device protocol over CPU tensors and
  shared-memory rings; ``cpu_device_communicator`` opens one rank of it.
- ``cpu_protocol``   - the ``cpu_protocol`` test mode (``CGC_TEST_DEVICE_PROTOCOL=1``):
  every ``cpu`` binding runs the device protocol over ``ShmCpuTransport``.
- ``shm_ipc_device`` - ``ShmIpcDevice``: the CUDA IPC device calls over shared-memory
  segments, so the CUDA IPC protocol runs without a GPU.
- ``fake_hosts``     - the fake NCCL hosts (``CGC_NCCL_FAKE_HOSTS=1``): each rank joins
  NCCL as a host of its own, so two ranks share one GPU over sockets.

Example:
    >>> from cgc.runtime.comm.testing.fake_hosts import fake_host_env
    >>> fake_host_env("w0")["NCCL_HOSTID"]
    'cgc-fake-w0'
"""
