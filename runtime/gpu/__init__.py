"""cgc's GPU data plane: device communicators, tensor headers, streams, transport binding.

Nothing here imports cupy, NCCL or CUDA when the package is imported; each module loads
what it needs when used, so CPU-only machines import and test all of it.

Modules (each docstring has the details and an example):

- ``binding``   - ``bind_communicators(members, choice)``: nccl | cuda_ipc | host_staging |
  cpu per communicator, from (node, GPU UUID) per member; ``probe_gpu_uuid()``; the
  test-only fake-hosts mode (``apply_fake_hosts``).
- ``factory``   - ``open_device_communicator(transport, ...)``: one call per member.
- ``nccl``      - ``make_unique_id()`` (rank 0), ``NcclCommunicator`` (ctypes or cupy
  binding, ``nccl_lib``); ``torchdist.TorchDistCommunicator`` over a user's group.
- ``ipc``       - ``CudaIpcCommunicator`` for actors sharing one GPU: the protocol over
  ``IpcTransport`` (exported slot buffers, interprocess events; ``ipc_devices``).
- ``staging``   - ``HostStagingCommunicator`` (pinned host memory around a host comm).
- ``protocol``  - the value protocol (headers, static edges, errors as values, collective
  status words) shared by the NCCL, torch.distributed and CUDA IPC communicators.
- ``transport`` - the ``DeviceTransport`` interface under it (posting or describing) and
  ``GatheringTransport`` (collectives from pairwise moves).
- ``tensors``   - split a value into header + device tensors and back.
- ``sidechannel`` - ordered host messages per rank pair (``ShmSideChannels``; pluggable).
- ``streams``   - ``ActorStreams``: compute/comm streams, events, lifetimes, sync counter.
- ``warmup``    - ``p2p_peers(plan, comm_index, actor)``, ``warm_up(comm, peers)``.
- ``cpu_transport`` - the CPU stand-in transport that runs the protocol in CI.

Set-up order (per graph; see each module): probe (``apply_fake_hosts`` in test mode, then
``probe_gpu_uuid``) -> driver binds -> rank 0 of each NCCL communicator
``make_unique_id()`` -> every member opens its communicators in plan order -> ``warm_up``
in plan order -> loop. Per op: ``send(value, peer, timeout, shape=, dtype=)``,
``recv(peer, shape=, dtype=, timeout=)``, ``allreduce/allgather/reducescatter``;
``last_event`` for an executor that defers compute-stream waits; ``abort()`` from any
thread; ``destroy()`` at teardown.
"""
