"""Stage `records`, the bottom of the house: the record format and everything that reads one.

Owns the record files (`store`: paths, atomic writes, loading, the schema version), the
column registry (`columns`: every field, where it shows), how runs group into configurations
(`grouping`), the placement check of a child's result (`placement_check`) and MFU from a
record (`mfu`). Imports nothing from the other stages: plan, run, analysis and report all
read records through this package.
"""
