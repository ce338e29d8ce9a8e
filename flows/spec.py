"""The release spec, as the flows import it: the model itself is ``kepsilon.spec`` (engine level, no Prefect).

Kept so that ``from kepsilon.flows.spec import ReleaseSpec`` (flows, tasks, benchmarks, reliability, tests)
goes on working; new code imports from ``kepsilon.spec``.
"""

from kepsilon.spec import (
    CertificateSettings,
    DPSearch,
    DPSettings,
    EQuasi,
    Execution,
    IdentifierReason,
    KQuasi,
    LDiversity,
    Population,
    ReleaseSpec,
    Roles,
    SensitiveColumn,
    SourceFormat,
    SourceSpec,
    TCloseness,
    check_dp_parameters,
    check_kepsilon_parameters,
    load_spec,
    parse_spec,
    require_kepsilon_mode,
    resolve_paths,
)

__all__ = [
    "CertificateSettings",
    "DPSearch",
    "DPSettings",
    "EQuasi",
    "Execution",
    "IdentifierReason",
    "KQuasi",
    "LDiversity",
    "Population",
    "ReleaseSpec",
    "Roles",
    "SensitiveColumn",
    "SourceFormat",
    "SourceSpec",
    "TCloseness",
    "check_dp_parameters",
    "check_kepsilon_parameters",
    "load_spec",
    "parse_spec",
    "require_kepsilon_mode",
    "resolve_paths",
]
