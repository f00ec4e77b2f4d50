"""`python -m testbed.map`: "parameter server or allreduce, and when?" for one model and cluster.

For every cell (workers N, bandwidth, latency) every configuration the strategies offer
(`StrategySpec.map_variants`) is predicted by its own spec's cost model (`predict`, the model a
run prints beside its measurement), ranked by predicted step time, and a few cells are run as
emulated experiments through `testbed.session.execute` to show measured beside predicted.

    grid.py        the command's input, validated before Ray (pure)
    table.py       configurations x cells -> predictions, one row each (pure)
    rank.py        the ranking: winner, runner-up, margins, efficiency (pure)
    spotchecks.py  which cells to check, and running them (the only module that starts Ray)
    accuracy.py    samples to a target loss, for the updates that are not synchronous steps
    report.py      map.md, the answer in sentences (pure)
    figure.py      map.png / map.svg, the winner per cell
"""
