"""DuckDB read models folded from the event stream (see projections.runner)."""

from projections.agents import AgentsProjection, ImagesProjection, PullsProjection
from projections.base import Projection
from projections.policies import PoliciesProjection
from projections.quarantine import QuarantineProjection
from projections.sessions import SessionsProjection
from projections.users import UsersProjection

# Every read model the manager keeps, in the order their views are created (a view may read
# the tables of the projections before it).
ALL: tuple[type[Projection], ...] = (
    SessionsProjection,
    AgentsProjection,
    ImagesProjection,
    PullsProjection,
    PoliciesProjection,
    QuarantineProjection,
    UsersProjection,  # who may read what (services.manager.queries)
)
