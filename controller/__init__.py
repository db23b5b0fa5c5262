"""The controller role: partition map, placement, shutdown (pure state + MPI runtime)."""
