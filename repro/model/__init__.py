"""The checkpoint side: its config, lazy tensor reading and checks, the weights of one layer (and
their W8A8 quantisation), the tiny generator and `repro inspect`."""
