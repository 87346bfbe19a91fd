"""What test modules share: paths and the CLI (cli), whole sweeps through it (sweeps), the
local SLURM cluster's paths (slurm), the toy runner's sweeps (toy), the equivalence step
(equivalence), hand-made records (records) and the sharded-state checks (sharding).

Test modules import these from here, never from tests/conftest.py (fixtures and hooks only)
nor from one another (tests/test_test_layout.py holds them to it)."""
