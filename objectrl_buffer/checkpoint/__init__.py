"""Versioned, atomic, verified persistence: the ``.metadata`` file and its data generations
(:mod:`.generations`), the data folder (:mod:`.data`), its manifest (:mod:`.manifest`) and durable file
I/O (:mod:`.io`)."""
