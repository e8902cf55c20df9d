"""The engine loop: requests in, steps scheduled, launched, read back and committed; it imports
only the layers below app (domain, ports) and names workers by the ``Worker`` protocol."""
