"""Channel tests: child processes import ``chan_children`` from this folder (the ``prefix``
fixture with its /dev/shm leak check is the root conftest's)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # child processes import chan_children
