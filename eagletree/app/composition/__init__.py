"""Composition: settings resolved for the machine, checkpoints checked, and the container that
assembles the engine (the only package naming concrete adapters); imports workers, engine and
parallel groups, never the command line, server, bench or training."""
