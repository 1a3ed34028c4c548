"""Graphs the way vLLM captures them: the capture primitive (`piece`), the decode chain's graph
runner (`runner`), race amplification and host readback (`race`), and the runner's findings."""
