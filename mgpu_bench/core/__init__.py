"""The process itself: what every command stands on. Imports nothing else of the package.

    errors.py     the exceptions, their one-line messages and exit codes; signals deferred at a run's end
    children.py   the processes the tool starts die with it; temporary folders of dead runs removed
    paths.py      where the tool writes (history, state, reports): checked before measuring, written atomically
    startup.py    start-up as every estimate counts it: the interpreter, imports and the ranks' processes
    launch.py     how ranks start: under torchrun, srun or mpirun (the launcher's environment), or here (relaunch)
    ranks.py      the started ranks together: their store and groups, the roll call when one leaves
    slurm.py      Slurm's own contract through scontrol: this node, its state, drain and resume
"""
