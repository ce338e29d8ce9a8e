"""kepsilon: governed, auditable (k,ε)-anonymised releases of microdata."""

__version__ = "0.1.0"
