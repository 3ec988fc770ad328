"""Orchestration: the `algo-train` command line and everything that turns a config into a running process
graph, keeps it alive and records it. `cli` (the entry point) dispatches to sub-packages layered top to
bottom; a package imports only those below it (`tests/test_boundaries.py` holds the order):

    doctor      `algo-train doctor`: is this cluster ready for this run?
    commands    the commands a user types (train, eval, plot), their flags, the console, the supervisor
    loop        the training loop: `run_graph` wires the processes, the driver steps them, metrics, progress
    state       run state and recovery: run folders, ledger, position, checkpoints, the buffer keeper
    processes   the roles placed on the cluster (learner ranks, actors) and their deaths
    prep        data and model preparation, and the checks of every file a run names
    planning    what the cluster has and where each role goes: resources, placement, memory

docs/architecture.md draws the whole system."""
