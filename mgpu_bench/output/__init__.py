"""How results are shown: the terminal, tables, the HTML page, plots and Prometheus text. Imports core and
results; no probe, no history.

    console.py     the terminal and the pipe: progress, lines, colour
    tables.py      tables that fit the terminal's width, wrapped by column
    html_page.py   the self-contained HTML report page
    plotting.py    matplotlib without a display
    prometheus.py  headline metrics as Prometheus' text exposition format
"""
