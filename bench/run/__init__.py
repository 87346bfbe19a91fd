"""Stage `run`: executing the plan. Framework environments (`envs`) and the environment
captured into records (`environment`), the local launcher and supervisor (`launch`), SLURM
jobs (`slurm` submits and collects, `slurm_job` runs inside the job), the guard that kills a
run whose parent died (`guard`), the results folder's lock (`sweep_lock`), GPU telemetry
(`telemetry`), the peak-FLOPS probe (`peak`), progress lines (`progress`), the sweep
engine (`sweep`), the dry run's forecast (`forecast`) and check-model's children
(`check_model`).

May import `catalog`, `records` and `plan`; never `analysis` or `report`.
"""
