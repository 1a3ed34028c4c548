"""Templates of the standalone reproducers `repro report` writes (`gdn_chain/`: the GDN layer chain,
eager vs graph replay, in plain torch, kept in parts that `generate.py` joins into the one script).
They import nothing from this package."""
