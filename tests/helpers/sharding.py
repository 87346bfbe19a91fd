"""How a record's state bytes per device show a runner's layout: split over the devices
(sharded runners) or whole on each (data parallelism), as jax's addressable_shards report."""

from __future__ import annotations

from contract.reasons import sentence
from runners.jax.state import PARTS


def assert_split(rec: dict, n: int) -> None:
    """Every part held as about 1/n per device (the replicated small leaves allowed: 2% of the
    whole), the shards together the whole, every device named."""
    per_device, whole = rec["state_bytes_per_device"], rec["state_bytes_global"]
    assert len(per_device) == n, per_device
    for part in PARTS:
        held = [d[part] for d in per_device.values()]
        assert whole[part] > 0
        assert all(whole[part] / n * 0.99 <= b <= whole[part] / n + 0.02 * whole[part]
                   for b in held), (part, held, whole[part])
        assert sum(held) >= whole[part], (part, held, whole[part])


def assert_replicas(rec: dict, n: int) -> None:
    """Every part held whole on every one of the n devices (plain data parallelism)."""
    per_device, whole = rec["state_bytes_per_device"], rec["state_bytes_global"]
    assert len(per_device) == n, per_device
    for part in PARTS:
        assert whole[part] > 0
        assert [d[part] for d in per_device.values()] == [whole[part]] * n, (part, per_device)
    assert "addressable_shards" in sentence(rec["state_source"])
