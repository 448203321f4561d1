"""Where rows live and how they get out: the row table (:mod:`.table`), its placement on disk or in RAM
(:mod:`.placement`, :mod:`.prefault`), fast writes (:mod:`.fast_write`) and delivery to the training
device (:mod:`.staging`)."""
