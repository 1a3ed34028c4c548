"""Is replay equal to eager, and if not, what kind of difference is it: comparison and the
`Divergence` record (`compare`), the one-read device check (`stepcheck`, `outflags`), the oracle
that classifies a difference (`oracle`), the independent third copy (`reference_copy`) and the
kernel call that shows a kernel finding alone (`kernelcase`)."""
