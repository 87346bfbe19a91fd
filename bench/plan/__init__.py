"""Stage `plan`: from a YAML file to the list of runs. The config model, its JSON schema and
validation (`config`), and the expansion into RunSpecs (`runs`).

May import `catalog` and `records` (how runs group); never `run`, `analysis` or `report`.
"""
