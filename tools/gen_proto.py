"""Regenerate plan_schema/plan_pb2.py from plan_schema/plan.proto.

Usage: python tools/gen_proto.py [--check]

--check exits 1 when the checked-in module differs from what protoc would write now
(tests/plan_schema/test_generated.py runs it). Needs grpcio-tools (the `dev` extra).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "plan_schema"
GENERATED = SCHEMA / "plan_pb2.py"


def generate(out_dir: pathlib.Path) -> pathlib.Path:
    """Run protoc on plan.proto into out_dir; return the generated module's path."""
    from grpc_tools import protoc  # dev-only dependency

    rc = protoc.main(
        ["protoc", f"-I{SCHEMA}", f"--python_out={out_dir}", str(SCHEMA / "plan.proto")]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return out_dir / "plan_pb2.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(pathlib.Path(tmp)).read_text()
    if args.check:
        current = GENERATED.read_text() if GENERATED.exists() else ""
        if current != fresh:
            print(f"{GENERATED.relative_to(ROOT)} is stale: run python tools/gen_proto.py")
            return 1
        print("plan_pb2.py is up to date")
        return 0
    GENERATED.write_text(fresh)
    print(f"wrote {GENERATED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
