"""The conformance run (`repro conform`): the mirror's rule families against vLLM's code on the same
drawn inputs (`run.conform`), the differences it explains (`explain`), and its table and page
(`table`)."""
