"""The fake NCCL hosts test mode (``binding.FAKE_HOSTS_ENV``, tests on one GPU).

With ``CGC_NCCL_FAKE_HOSTS=1`` the binder gives every all-GPU communicator ``nccl``, and
each actor calls ``apply_fake_hosts(name)`` before its first NCCL call, so NCCL sees one
"host" per rank and accepts two ranks on one device over sockets (slow, correct).

Example:
    >>> fake_host_env("w0")["NCCL_SOCKET_IFNAME"]
    'lo'
"""

from __future__ import annotations

import os

__all__ = ["fake_host_env", "apply_fake_hosts"]


def fake_host_env(tag: str) -> dict[str, str]:
    """The NCCL environment that makes this process a host of its own named ``tag``.

    Raises nothing.

    Example:
        >>> fake_host_env("w0")["NCCL_HOSTID"]
        'cgc-fake-w0'
    """
    return {"NCCL_HOSTID": f"cgc-fake-{tag}", "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}


def apply_fake_hosts(tag: str) -> dict[str, str]:
    """Set ``fake_host_env(tag)`` in this process (call before its first NCCL call, i.e.
    in the set-up probe: NCCL caches most of these settings). Returns what was set.

    Raises nothing.

    Example: ``apply_fake_hosts("w1")["NCCL_HOSTID"] == "cgc-fake-w1"``.
    """
    env = fake_host_env(tag)
    os.environ.update(env)
    return env
