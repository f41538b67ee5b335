"""A method with two return values, each consumed by a different actor.

execute(text) splits `text` into its words and its length; one actor counts words, another
formats the length, and both results come back as a list.
"""

import cgc
from cgc import InputNode, MultiOutputNode


@cgc.actor
class Splitter:
    @cgc.method(num_returns=2)
    def split(self, text):
        return text.split(), len(text)


@cgc.actor
class Counter:
    def count(self, words):
        return len(words)


@cgc.actor
class Formatter:
    def describe(self, n, unit="chars"):
        return f"{n} {unit}"


def build_dag():
    splitter, counter, formatter = Splitter.bind(), Counter.bind(), Formatter.bind()
    with InputNode() as inp:
        words, length = splitter.split.bind(inp)
        return MultiOutputNode([counter.count.bind(words), formatter.describe.bind(length)])


def example_inputs():
    return ("static graphs compile ahead of time",)
