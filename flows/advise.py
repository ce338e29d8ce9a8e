"""The ``advise`` flow: the parameter advisor on a Prefect server, with its plots on the run's page.

It reads the private table and shows figures computed from it, so it is for the steward only: it spends no
ε, writes nothing where releases are published, and is recorded in the audit store as an advice event. The
computation is ``kepsilon.tasks.advise`` (no Prefect in it); this module only wraps it.

No ``from __future__ import annotations`` here: served runs need the pydantic parameter's real types.
"""

import getpass
from typing import Annotated

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from kepsilon.flows.report import artifact_key, publish_figure_artifact
from kepsilon.flows.run_form import FormModel
from kepsilon.flows.spec import ReleaseSpec, require_kepsilon_mode
from kepsilon.tasks.advise import (
    DEFAULT_DRAWS,
    DEFAULT_EPSILON,
    DEFAULT_K,
    MAX_DRAWS,
    AdviceRun,
    advice_markdown,
    advise_and_record,
)
from kepsilon.tasks.figures import ADVICE_CAPTIONS
from kepsilon.tasks.record import store_location


class AdviceRequest(FormModel):
    """The advise flow's one parameter, rendered as the deployment's run form: a spec and a grid.

    Plain list defaults (not ``default_factory``) so the form shows them. The grid comes first on the form,
    then the spec (whose own k, ε, release id and source lead).
    """

    form_title = "advice request"
    form_first = ("k_values", "epsilon_values", "spec")

    spec: ReleaseSpec = Field(description="the release spec to advise on; its k and ε are replaced by the grid")
    k_values: list[int] = Field(default=list(DEFAULT_K), description="k values of the grid (each at least 2)")
    epsilon_values: list[float] = Field(default=list(DEFAULT_EPSILON), description="ε values of the grid (each above 0)")
    draws: int = Field(default=DEFAULT_DRAWS, ge=2, le=MAX_DRAWS, description="Monte-Carlo noise draws per cell")
    target_error: Annotated[float, Field(gt=0)] | SkipJsonSchema[None] = Field(default=None, description="answer: the smallest ε whose predicted error is at most this")
    max_linking_risk: Annotated[float, Field(gt=0, lt=1)] | SkipJsonSchema[None] = Field(
        default=None, description="answer: the smallest k whose linking risk is at most this"
    )

    @model_validator(mode="after")
    def _the_method_s_own_mode(self):
        require_kepsilon_mode(self.spec, "the advisor")
        return self


@task(name="advise", cache_policy=NO_CACHE, persist_result=False)
def run_advisor(request: AdviceRequest, operator: str, store: str) -> AdviceRun:
    """Prefect task: read, record the read, compute the grid (noise drawn here and thrown away), draw."""
    return advise_and_record(
        request.spec,
        operator=operator,
        via="flow",
        k_values=request.k_values,
        epsilon_values=request.epsilon_values,
        draws=request.draws,
        target_error=request.target_error,
        max_linking_risk=request.max_linking_risk,
        flow_run_id=str(flow_run.id),
        store=store,
    )


@flow(name="advise", persist_result=False, log_prints=False, validate_parameters=True)
def advise(request: AdviceRequest) -> dict:
    """Advise on k and ε for one spec; attach the grid and its three plots to this run. Spends no ε."""
    logger = get_run_logger()
    spec = request.spec
    operator = spec.operator or getpass.getuser()
    outcome = run_advisor(request, operator, store_location())
    name = f"advice-{spec.population_id}"
    markdown = advice_markdown(outcome.advice, request.target_error, request.max_linking_risk)
    create_markdown_artifact(key=artifact_key(name), markdown=markdown, description="parameter advice (private)")
    publish_figure_artifact(name, outcome.figures, ADVICE_CAPTIONS, "private figures of the parameter advice")
    logger.info("advice on %s recorded as advice event %d; no ε spent", spec.population_id, outcome.event_id)
    return {"event_id": outcome.event_id, "report_dir": str(outcome.report_dir), "advice": outcome.advice.to_dict()}
