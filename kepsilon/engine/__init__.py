"""kepsilon's algorithms as a plain library: no Prefect, no Great Expectations, no audit store.

A notebook, a test or a Dask worker imports what it needs from here. So far: ``dp``, the (ε,δ)
accountant of safe k-anonymisation after sampling. A governed release still goes through the flow.
"""
