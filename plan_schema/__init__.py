"""The .cgplan contract: the protobuf schema, the file envelope, typed values, defaults and
limits, and the verifier (``cgc.plan_schema.verify``: structure check, bounds, simulator).

Imported as ``cgc.plan_schema``; shared by the compiler and the runtime (which must not
import the compiler). Importing this package does not import the verifier.
"""

from __future__ import annotations

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import CgcError, PlanFormatError, UntrustedPlanError
from cgc.plan_schema.planfile import read_plan, read_plan_bytes, write_plan, write_plan_bytes
from cgc.plan_schema.version import CGC_VERSION, FORMAT_MAJOR, FORMAT_MINOR, PRODUCER

__all__ = [
    "pb",
    "CgcError",
    "PlanFormatError",
    "UntrustedPlanError",
    "read_plan",
    "read_plan_bytes",
    "write_plan",
    "write_plan_bytes",
    "CGC_VERSION",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "PRODUCER",
    "DRIVER",
]

# Endpoint name of the driver process in channels and programs.
DRIVER = "@driver"
