"""Stage `report`, the top: what a person reads. The terminal table, summary.csv and charts
(`summary`), report.html (`html`), the all-reduce probe's table and chart (`allreduce`) and
the telemetry charts (`telemetry_chart`).

May import every stage below it (`records`, `catalog`, `plan`, `run`, `analysis`); nothing
imports it but the cli.
"""
