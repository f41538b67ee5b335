"""Echo: one actor returns its input. The smallest graph; the latency benchmark's base case.

    cgc compile examples/echo.py -o echo.cgplan && cgc run echo.cgplan
"""

import cgc
from cgc import InputNode


@cgc.actor
class Echo:
    def echo(self, x):
        return x


def build_dag():
    echo = Echo.bind()
    with InputNode() as inp:
        return echo.echo.bind(inp)


def example_inputs():
    return ("hello",)
