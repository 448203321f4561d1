"""Which slots to read: uniform draws, recency windows and epochs (:mod:`.uniform`), n-step returns
(:mod:`.nstep`), episode slices (:mod:`.slices`) and the sum tree of prioritized replay (:mod:`.sum_tree`).
Pure functions of the ring state and the stored columns; the buffer owns the state and reads the rows."""
