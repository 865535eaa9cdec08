"""``ampd profile``: measure engines and fit AMPD's cost model from them (docs/PROFILING.md)."""
