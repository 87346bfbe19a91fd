"""Each family's catalog: its runners (module, options, precisions, launcher), pipelines and
all-reduce probes, one module per family. bench.catalog.registry collects them; a new runner is
one RunnerInfo here beside its module in runners/<family>/."""
