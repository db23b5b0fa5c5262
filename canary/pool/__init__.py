"""Several jobs sharing one long-lived pool of workers (see docs/sharing.md).

``canary cluster start`` launches the pool under mpiexec; ``canary submit`` hands it a driver
script, unchanged from what ``canary run`` runs. The Python API for scripted experiments is in
:mod:`canary.pool.client` (``submit``, ``wait``, ``result``, ``cancel``, ``jobs``).
"""
