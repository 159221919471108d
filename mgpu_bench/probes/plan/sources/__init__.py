"""Where a plan's figures come from: what the history measured (read from the stored result
documents, each figure with the id of the run it came from) and, for another GPU (--gpu), the
datasheet's figures and the ratio a measured step is scaled by. Reads; computes no plan (estimate/
does).

    index.py      where the evidence is: the history's metric index and run rows (read-only SQL)
    clean.py      whether a run's figures are its GPUs' own (shared, throttled, interrupted, below a floor)
    evidence.py   what the history measured: model, memory, comm, fleet and gemm runs
    target.py     another GPU (--gpu): the step scaled, memory and links from the datasheet
"""
