"""Carrying out one command, for any probe of the registry. Imports every folder below the CLI, the suite
and the monitor; none of those below imports it.

    runner.py  select the GPUs, launch the ranks, run the probe, print it
    keep.py    keep what it gave: the history row, the JSON, the Prometheus textfile, a run kept for later
"""
