"""A driver that declares an impossible program: one compute stage over datasets of 2 and 3
partitions (canary raises PartitionMismatchError, a DeclarationError, on every rank)."""

import sys

import numpy as np

import canary


def main(argv: list[str] | None = None) -> int:
    p = canary.Program("declaration_error")
    a, b = p.dataset("a", 2), p.dataset("b", 3)
    p.load([a, b], lambda i, n: (np.zeros(1), np.zeros(1)))  # raises: mismatched
    p.compute(lambda x, y: x + y, [a, b], [a], name="mismatched")
    p.report(a)
    canary.run(p)
    return 0


if __name__ == "__main__":
    from canary.script import run_main

    sys.exit(run_main(__file__))
