"""`repro bench`: eager vs replay per island and batch, repair costs, the bandwidth floor, and
checked lockstep rates."""
