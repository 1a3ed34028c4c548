"""What a case changes: the typed options (`options`) and the one table of hazards and repairs
that set them (`hazards`)."""
