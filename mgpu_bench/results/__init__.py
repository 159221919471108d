"""How a measurement is taken and written down, and the protocol every probe keeps. Imports core,
machine and the native module.

    probe.py         the probe protocol and the registry: what every measuring command is, in one place
    document.py      the result document: a versioned JSON envelope around a probe's data
    schema.py        the documents' declared shape, checked wherever one is read
    measurement.py   one measurement model for every backend: spec, raw samples, derived figures
    torch_timing.py  timing torch work on one device (CUDA events on a GPU, the clock on a CPU)
    metrics.py       headline metrics: the few figures a person compares between runs
    ops.py           the collectives, their size rules and bandwidth formulas
    sizes.py         byte sizes as users write them (8, 1K, 64M, 1G)
    numbers.py       numbers as users type them
    nccl_tests.py    nccl-tests' and rccl-tests' text output read into comm documents
"""
