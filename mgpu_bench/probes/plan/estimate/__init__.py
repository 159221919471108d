"""A plan's arithmetic from its sources (sources/): will the model fit and how, the step on N
GPUs, the answer (days for --gpus, GPUs for --days) where the layout asked fits, what the global
batch is worth (--noise-scale), and the plan's payload with every figure's source and what is
missing. It computes from the figures sources/ read; the one stored run it reads itself is the one
--noise-scale names (goodput.resolve).

    memory.py     the fit: model states (ZeRO's stages), activations, the fewest GPUs, the largest batch
    project.py    the step on N GPUs: measured, or compute (+ bubble, tp and pp traffic) + the exposed
                  gradient collectives
    answer.py     fit first: the answer where the layout fits, what fits instead where it does not
    goodput.py    --noise-scale: each GPU count's statistical efficiency, goodput, days to the same progress
    build.py      the plan from those, and what is missing
"""
