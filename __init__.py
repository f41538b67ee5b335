"""The root of cgc's source tree: not a package of its own, a hand-over to the installed cgc.

Why this file: ``git clone ... cgc`` makes a folder ``cgc`` holding this tree, and a script
written beside it has that folder's parent first on ``sys.path``. Without this file Python
imports the clone folder as an empty namespace package ``cgc``, found before the editable
install's finder is asked, and ``from cgc import InputNode`` fails with "cannot import name
'InputNode' from 'cgc' (unknown location)". With it, importing the folder as ``cgc`` finds
the installed cgc without that folder on the path (an editable install of this or another
clone, or a regular install in site-packages) and hands over: ``sys.modules["cgc"]`` becomes
the real package, which Python's import returns.

Nothing here runs in an installed cgc (wheels hold ``cgc/``, not this file), nor when the
tree is imported under another name.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _hand_over(name: str) -> None:
    """Import the installed package ``name`` in place of this folder.

    Raises:
        ImportError: no cgc is installed besides this source tree.
    """
    here = os.path.realpath(os.path.dirname(__file__))
    beside = os.path.dirname(here)
    saved = sys.path[:]
    me = sys.modules.pop(name)
    try:
        sys.path[:] = [p for p in saved if os.path.realpath(p or os.getcwd()) != beside]
        spec = importlib.util.find_spec(name)
    finally:
        sys.path[:] = saved
    origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else ""
    if spec is None or spec.loader is None or origin == os.path.realpath(__file__):
        sys.modules[name] = me
        raise ImportError(
            f"{here} is cgc's source tree, not an installed cgc: install it first "
            f"(pip install -e {here}), then run your script again", name=name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


if __name__ == "cgc":
    _hand_over(__name__)
