"""What the machine is and what it should deliver. Imports core and the native module only.

    hardware.py   reference figures: GPU peaks and memory, NVLink, PCIe and network link rates
    topo.py       the node's topology as data: GPUs, PCIe and NVLink links, GPU pairs, NICs
    topo_view.py  what a topology snapshot says: its findings, and nvidia-smi topo -m's view on the terminal
    theory.py     what a collective's bus bandwidth should reach on the path its data takes
    telemetry.py  clocks, power, temperature and throttle reasons sampled through NVML while a probe runs
    occupancy.py  who else is on the GPUs: our processes told apart from the others
    health.py     a GPU's health facts through NVML, as findings
    env.py        the environment fingerprint stored with every result
    per_gpu.py    native work on every GPU at once, one host thread each
    selection.py  which GPUs a command measures: discovery, the --gpus forms, pinning child processes
    nccl_log.py   what NCCL states about itself in its INFO log: transports per pair, settings applied
"""
