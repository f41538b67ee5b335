"""What runs inside each actor's process: the loop that replays the actor's program.

The driver reaches this code only through Ray (``actor.__ray_call__`` with the functions
of ``entry``); nothing here runs in the driver's process.

- ``entry``       - the functions the driver runs inside an actor: set-up rounds, start,
  stop, stats (one graph each, by graph id).
- ``host``        - ``ActorHost``: the user's class built inside the actor; ``user_object``.
- ``loops``       - this process's actor loops, by graph id, and what exited ones left.
- ``loop_state``  - what one loop holds: the options the driver sent, shared state.
- ``loop_setup``  - a loop's set-up: host channels, communicators, bells, warm-up.
- ``executor``    - ``ActorLoop``: replays the program in a loop thread.
- ``op_compile``  - the program's ops as closures, and the CUDA stream waits between them.
- ``op_text``     - one-line text of an op for hang reports and timeouts.
- ``ray_events``  - Ray Compiled Graph's per-task profiling records, kept as Ray keeps them.
"""
