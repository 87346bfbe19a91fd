"""Stage `catalog`: what can run. The registry of runners, families, pipelines and probes
(read from each family's framework-free `contract/catalogs/<family>.py`), the `new-runner`
templates, and the equivalence coverage table drawn from the catalog.

Imports only `bench.errors` and leaf modules; every other stage may import it.
"""
