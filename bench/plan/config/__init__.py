"""Sweep configuration: YAML in, a validated SweepConfig out, or a one-line ConfigError.

The file's keys are declared once, in contract/settings.py; by concern:
- `yaml_reader`: the file read within bounds and parsed (a key twice, an alias bomb refused);
- `load`: --set overrides, then `validate` (the model, then the rules) and `load_config`;
- `model`: the pydantic model built from the declaration, the registry (every runner's
  options: `options`) and models/ (`custom_models`), the keys of their own (`_own_types`,
  the mappings of `sections`, the types of `declared`); `run_bench.py schema` prints it;
- `translate`: pydantic's first error as the one-line message of its key (`messages`);
- `rules`: the rules that span keys, and the resolved `SweepConfig` (`sweep_config`).

Parent side only: runners and framework environments never import this package (pydantic).
"""

from bench.errors import ConfigError
from bench.plan.config.custom_models import custom_entry, model_name
from bench.plan.config.declared import INT_MAX, SIZE_WORDS, parse_size
from bench.plan.config.load import apply_override, load_config, validate
from bench.plan.config.messages import SHOW_CHARS, Says, show_value
from bench.plan.config.model import json_schema, sweep_model
from bench.plan.config.rules import CAPACITY_KEYS, depth_models
from bench.plan.config.sections import (
    AUGMENTATIONS,
    BACKENDS,
    CapacitySearch,
    Cluster,
    Converge,
    CustomModel,
    Dataset,
    ModelInput,
    Telemetry,
    UntilStable,
)
from bench.plan.config.sweep_config import BATCH_KEYS, KEYS, SweepConfig
from bench.plan.config.yaml_reader import (
    MAX_CONFIG_BYTES,
    MAX_SET_BYTES,
    MAX_SET_PARTS,
    MAX_YAML_DEPTH,
    MAX_YAML_SIZE,
    DuplicateKeyError,
    YamlTooLarge,
    parse_yaml,
    read_config_text,
)
from contract.settings import PRECISIONS

__all__ = [
    "AUGMENTATIONS", "BACKENDS", "BATCH_KEYS", "CAPACITY_KEYS", "INT_MAX", "KEYS",
    "MAX_CONFIG_BYTES", "MAX_SET_BYTES", "MAX_SET_PARTS", "MAX_YAML_DEPTH", "MAX_YAML_SIZE",
    "PRECISIONS", "SHOW_CHARS", "SIZE_WORDS", "CapacitySearch", "Cluster", "ConfigError",
    "Converge", "CustomModel", "Dataset", "DuplicateKeyError", "ModelInput", "Says",
    "SweepConfig", "Telemetry", "UntilStable", "YamlTooLarge", "apply_override",
    "custom_entry", "depth_models", "json_schema", "load_config", "model_name", "parse_size",
    "parse_yaml", "read_config_text", "show_value", "sweep_model", "validate",
]
