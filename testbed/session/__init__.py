"""The one code path of a run, for the command line, sweeps and the map alike.

    execute.py      validate, start Ray, run the strategy, write the run folder (`execute`)
    interrupts.py   the one signal policy (SIGINT/SIGTERM/SIGHUP) and its watchdog
    evaluation.py   held-out evaluation of the authoritative model (a nice-19 process)
"""
