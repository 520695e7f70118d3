"""What a perf run shows: the terminal table, plots, the HTML report and the slot timeline."""
