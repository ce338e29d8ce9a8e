"""kepsilon: governed, auditable (k,ε)-anonymised releases of microdata."""

import os

__version__ = "0.1.0"

# Safe defaults before Prefect or Great Expectations read their settings: persisted results are
# world-readable pickles (microdata must never land there), and telemetry fails noisily offline.
# An operator's explicit setting wins.
for _name, _value in {
    "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
}.items():
    os.environ.setdefault(_name, _value)
