"""The recipe stage: a YAML file in, a validated, typed ``Recipe`` out (or every problem, located).

``yaml_reader`` reads safe YAML with positions, ``schema`` validates against schemas/recipe.schema.json
and words the errors, ``crosscheck`` holds the rules the schema cannot express, ``load`` puts them
together, ``model`` is the typed view and ``reference`` renders the recipe reference page.
"""

from .crosscheck import match_source_pattern
from .load import check_recipe, load_recipe, recipe_sha256, resolved_yaml
from .model import (
    Checks,
    Decontamination,
    EvalSet,
    ExportSpec,
    GenerationSettings,
    HubRef,
    LaunchSpec,
    Mapping,
    NearDuplicateSettings,
    OutputSpec,
    Recipe,
    SourceSpec,
    SplitSpec,
    Take,
    Target,
)
from .yaml_reader import Problem

__all__ = [
    "Checks", "Decontamination", "EvalSet", "ExportSpec", "GenerationSettings", "HubRef", "LaunchSpec", "Mapping",
    "NearDuplicateSettings", "OutputSpec", "Problem",
    "Recipe", "SourceSpec", "SplitSpec", "Take", "Target", "check_recipe", "load_recipe", "match_source_pattern",
    "recipe_sha256", "resolved_yaml",
]
