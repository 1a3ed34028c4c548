"""The runner's control path on the host: one scheduled step (`batch`) and the metadata the GDN
core reads."""
