"""The driver of ``declaration_error.py`` written at the top level, as a first driver often is:
no ``main()`` for ``run_main`` to call, so ``canary run``'s rank wrapper reports the error."""

import numpy as np

import canary

p = canary.Program("declaration_error_top_level")
a, b = p.dataset("a", 2), p.dataset("b", 3)
p.load([a, b], lambda i, n: (np.zeros(1), np.zeros(1)))  # raises: mismatched
p.compute(lambda x, y: x + y, [a, b], [a], name="mismatched")
p.report(a)
canary.run(p)
