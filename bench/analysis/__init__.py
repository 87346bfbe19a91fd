"""Stage `analysis`: numbers from records. Summary statistics, speedup and efficiency
(`stats`), repeat stability and bootstrap intervals (`trust`), comparing two sweeps
(`compare`), the sweep's exit status (`exit_status`) and the baseline gate
(`gate`), predicting scaling (`predict`), where the time went (`explain`), published
figures (`published`), nominal interconnect bandwidths (`interconnects`) and the notebook's
DataFrame loader (`loader`).

May import `catalog`, `records` and `plan`; never `run` or `report`.
"""
