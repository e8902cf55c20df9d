"""App: training draft heads (EAGLE, EAGLE-3) against a target checkpoint — `train-draft`."""
