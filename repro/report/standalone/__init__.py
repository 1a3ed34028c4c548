"""Templates of the standalone reproducers `repro report` writes (`gdn_chain.py`: the GDN layer
chain, eager vs graph replay, in plain torch). They import nothing from this package."""
