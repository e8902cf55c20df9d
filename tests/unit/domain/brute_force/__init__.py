"""Reference semantics in plain Python for the domain tests: loops over lists, obviously correct.

Nothing here imports eagletree. Scores are float32 in the library, so every product is rounded
to float32 (a product of two float32 values is exact in a Python float, one rounding then gives
IEEE float32 multiplication); that keeps ties and orders bit-identical to the tensors'.
"""
