"""cgc.plan_schema.verify depends only on the rest of cgc.plan_schema and the standard
library (and protobuf).

The runtime runs the verifier at start; importing it must not pull in the compiler
(passes, frontend, networkx) or anything heavy.
"""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
before = set(sys.modules)
import cgc.plan_schema.verify, cgc.plan_schema.verify.observers
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_importing_the_verifier_loads_no_compiler_and_no_heavy_library():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    ours = [m for m in loaded if m == "cgc" or m.startswith("cgc.")]
    allowed = ("cgc.plan_schema",)
    assert ours and all(m == "cgc" or m.startswith(allowed) for m in ours), ours
    heavy = ("networkx", "ray", "torch", "numpy", "hypothesis")
    assert not [m for m in loaded if m.split(".")[0] in heavy]
