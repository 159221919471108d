"""The process itself: what every command stands on. Imports nothing else of the package.

    errors.py     the exceptions, their one-line messages and exit codes; signals deferred at a run's end
    children.py   the processes the tool starts die with it; temporary folders of dead runs removed
    paths.py      where the tool writes (history, state, reports): checked before measuring, written atomically
    startup.py    start-up as every estimate counts it: the interpreter, imports and the ranks' processes
    launch.py     running under torchrun, srun or mpirun: the launcher's environment, the ranks' store, relaunch
    slurm.py      Slurm's own contract through scontrol: this node, its state, drain and resume
"""
