"""Application: the engine loop, workers, composition, parallel launch, the command line, the
server, bench and training, each in a package of its own (their docstrings say what each may
import; pyproject.toml's import contracts hold them to it)."""
