"""The run form's schema hook, as the flows import it: the code is ``kepsilon.run_form`` (no Prefect), so that
the spec model at engine level (``kepsilon.spec``) can derive from ``FormModel``."""

from kepsilon.run_form import (
    FORM_TITLES,
    NOT_USED,
    OPTION_TITLES,
    TEXT_OPTION_TITLES,
    FormModel,
    form_schema,
    humanise,
    is_empty,
)

__all__ = ["FORM_TITLES", "NOT_USED", "OPTION_TITLES", "TEXT_OPTION_TITLES", "FormModel", "form_schema", "humanise", "is_empty"]
