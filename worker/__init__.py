"""The worker role: local task spawning from per-partition metadata (pure state + MPI runtime)."""
