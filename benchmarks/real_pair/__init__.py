"""A real target/draft pair made here from scratch, and its acceptance and speed through the
engine: ``python -m benchmarks.real_pair --out DIR`` (``__main__`` says what each phase does)."""
