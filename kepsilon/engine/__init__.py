"""kepsilon's algorithms as a plain library: no Prefect, no Great Expectations, no audit store.

A notebook, a test or a Dask worker imports what it needs from here; each stage of the method is in
the module named after it:

- ``hierarchy``, ``hierarchy_builders`` — generalisation hierarchies (files, or built from a public
  definition: intervals, masking, dates);
- ``mondrian``, ``ola`` — k-anonymisation (strict multidimensional; optimal full-domain with a
  suppression budget); ``partition`` — their result and the labels it publishes; ``anonymise`` —
  the stage driven by a release spec;
- ``criteria`` — ℓ-diversity and t-closeness of sensitive columns;
- ``perturb`` — Laplace noise per equivalence class; ``randomness`` — the release's draws keyed
  per record (Philox), so partitioning does not change them;
- ``suppress`` — c-confident and diversity suppression; ``assemble`` — the table to publish;
- ``metrics`` — errors, linking risk, class statistics (private figures);
- ``dp`` — the (ε,δ) accountant of safe k-anonymisation after sampling;
- ``stages`` — the release's stage sequence after k-anonymisation (perturb, suppress, merge, metrics), written
  once for the flow, ``preview`` and the partitioned path;
- ``preview`` — all of the above on a table in memory, as a release runs them, without governance.

A governed release (ε reserved in the ledger, seed sealed, gate, atomic publication, audit record)
goes through the flow: ``kepsilon release SPEC.yaml``.
"""
