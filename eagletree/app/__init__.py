"""Application: workers, scheduler, engine, the composition root and the command line."""
