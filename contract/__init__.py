"""The runner contract: what both the parent (bench/) and a runner's child process read.

Owns the run settings (`settings`), the spec (`spec`), the catalog types (`catalog`) and every
family's catalog (`catalogs/`), the precision policy (`precision_policy`) and the collectives'
sizes and checks (`collectives`). Framework-free: it may import the stdlib, numpy and `models`
(the built-in models' framework-free specs), never `bench` nor a framework. A runner's module
stays in runners/<family>/; its catalog line lives here so the parent never imports runners/.
"""
