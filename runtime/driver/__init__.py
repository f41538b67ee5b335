"""What runs in the user's (driver's) process: load a plan, start it, submit, tear down.

Nothing in this package runs inside an actor; the code the actors run is in
``cgc.runtime.actor``, and both sides use the channels (``cgc.runtime.channels``), the
communicators (``cgc.runtime.comm``) and the few shared modules at the top of
``cgc.runtime``.

- ``plan``          - ``Plan`` and ``load``: a ``.cgplan`` file in memory; ``Plan.start``.
- ``trust_gate``    - nothing from a plan runs before the trust gate passes.
- ``option_needs``  - what run options need installed, checked before Ray starts.
- ``start``         - ``start_graph``: from a ``Plan`` to a running ``CompiledGraph``.
- ``cluster``       - starting or joining Ray; can the plan's actors be placed.
- ``session``       - a graph lives and ends with the Ray session it started in.
- ``shm_space``     - do the plan's shared-memory rings fit in /dev/shm.
- ``plan_actors``   - creating the plan's actors or binding existing ones.
- ``graph``         - ``CompiledGraph``: execute, fail, tear down.
- ``graph_ends``    - the driver's ends of a running graph (input and output channels).
- ``result_book``   - results from the output channels to the refs; ``refs``: ``Ref``.
- ``graph_state``   - whether a running graph is going down, and why.
- ``monitor``       - notices a dead actor or a crashed loop and fails the graph.
- ``teardown``      - wake everything, wait for the loops, free every resource.
- ``interrupts``    - Ctrl-C around work that must finish once begun.
- ``wake``          - the wake-ahead window.

Importing the package imports none of its modules (``cgc compile`` needs only ``Plan``).
"""
