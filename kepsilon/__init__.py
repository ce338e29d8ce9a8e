"""kepsilon: governed, auditable (k,ε)-anonymised releases of microdata."""

import os

__version__ = "0.1.0"

# Safe defaults before Prefect or Great Expectations read their settings: persisted results are
# world-readable pickles (microdata must never land there), and telemetry fails noisily offline.
# DO_NOT_TRACK turns off Prefect's client telemetry and its first-run banner at a terminal; set here, it
# also reaches the processes the run starts (a Dask LocalCluster's workers inherit the environment).
# An operator's explicit setting wins.
for _name, _value in {
    "DO_NOT_TRACK": "1",
    "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
}.items():
    os.environ.setdefault(_name, _value)
