"""Entry point of poot-models: registers the shipped model families."""

from poot import hookimpl
from poot.models import ModelFamily


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    # Families are added with the model-family work; until then this package serves none.
    return []
