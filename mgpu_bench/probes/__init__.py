"""The probes: one folder per measuring command, each keeping the protocol of results/probe.py (the registry
finds it by name). A probe imports core, machine, results, training, workloads and output; never another
probe, the history, the runner or the suite.

    gemm/     TFLOP/s per dtype with the best cuBLASLt algorithm, against the datasheet peak
    memory/   fragmentation per allocator, HBM bandwidth, PyTorch's allocator, the largest batch that fits
    comm/     collectives' bus bandwidth against the link theory; nccl-tests logs read in
    links/    GPU-to-GPU copy bandwidth and latency for every ordered pair, host copies, the slow pair
    overlap/  compute and communication together: how much each slows the other
    model/    a training step's throughput, and where its time goes (the step ledger)
    plan/     how large a model the cluster holds, how many GPUs a schedule needs
    fleet/    which node, GPU, rail or link of a cluster is the bad one
    check/    is this node fit to run jobs, told to Slurm, NHC and node-problem-detector
    sdc/      silent data corruption: deterministic work hashed and compared across GPUs and runs
"""
