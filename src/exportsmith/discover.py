"""The installed transformers: version, package root, model types and the files exportsmith reads.

Model types come from transformers' own auto mapping (`CONFIG_MAPPING_NAMES`); several types can share one module
(`models/<module>/`), and a module is what gets vendored. Nothing here rewrites or writes anything.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

# Modules outside `models/` that modeling files import and codemods may rewrite (paths inside the package).
SHARED_MODULES = (
    "cache_utils.py",
    "masking_utils.py",
    "modeling_rope_utils.py",
    "integrations/sdpa_attention.py",
    "vision_utils.py",
    # the upstream form extends transformers' exporters (`cache-export`); nothing vendors it
    "exporters/exporter_dynamo.py",
)

# transformers 4.x ships TensorFlow and Flax ports beside the PyTorch modeling files; torch.export never sees them.
NON_TORCH_PREFIXES = ("modeling_tf_", "modeling_flax_")


def torch_modeling_files(folder: Path) -> tuple[Path, ...]:
    """The PyTorch `modeling_*.py` files of a model folder, sorted."""
    return tuple(path for path in sorted(folder.glob("modeling_*.py")) if not path.name.startswith(NON_TORCH_PREFIXES))


class DiscoveryError(Exception):
    """A problem the user can fix (transformers missing, unknown model): its message is one line."""


@dataclass(frozen=True)
class ModelFiles:
    module: str  # directory under models/, the name of the vendored package
    model_types: tuple[str, ...]  # the config model types that use this module
    modeling: tuple[Path, ...]  # modeling_*.py, sorted
    modular: tuple[Path, ...]  # modular_*.py, sorted


@dataclass(frozen=True)
class Transformers:
    version: str
    root: Path  # the `transformers` package directory

    def relpath(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def module_name(self, path: Path) -> str:
        return "transformers." + self.relpath(path).removesuffix(".py").replace("/", ".")

    @cached_property
    def model_types(self) -> dict[str, str]:
        """model type -> module, for every model type of the auto mapping. Importing transformers' auto module costs
        seconds, so the answer is cached under the digest of the file that defines it."""
        from .content_cache import ContentCache, key

        cache = ContentCache()
        name = key("model-types", self.version, (self.root / "models" / "auto" / "configuration_auto.py").read_bytes())
        found = cache.get(name)
        if found is None:
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

            found = {model_type: model_type_to_module_name(model_type) for model_type in sorted(CONFIG_MAPPING_NAMES)}
            cache.put(name, found)
        return found

    @cached_property
    def models(self) -> dict[str, ModelFiles]:
        """module -> its files, for every module that has a modeling file."""
        types: dict[str, list[str]] = {}
        for model_type, module in self.model_types.items():
            types.setdefault(module, []).append(model_type)
        result = {}
        for module in sorted(types):
            folder = self.root / "models" / module
            modeling = torch_modeling_files(folder)
            if modeling:
                result[module] = ModelFiles(
                    module, tuple(types[module]), modeling, tuple(sorted(folder.glob("modular_*.py")))
                )
        return result

    @property
    def shared_modules(self) -> tuple[Path, ...]:
        return tuple(self.root / relpath for relpath in SHARED_MODULES if (self.root / relpath).is_file())

    def parts(self, module: str) -> tuple[str, ...]:
        """The other modules whose models a model of `module` builds through transformers' auto classes: those of the
        sub-configs of its model types' default configs, and theirs (qwen2_audio's language model is a qwen2 model,
        llava's vision tower a clip one). A composite model generated without them would run transformers' own
        parts, which no codemod touched."""
        from transformers import PretrainedConfig
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.utils import logging

        found: set[str] = set()
        pending = [model_type for model_type in self.models[module].model_types]
        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # default configs warn about their own default token ids
        try:
            while pending:
                try:
                    config = CONFIG_MAPPING[pending.pop()]()
                except Exception:  # a config without defaults for every field names no parts
                    continue
                for name in getattr(config, "sub_configs", None) or {}:
                    sub = getattr(config, name, None)
                    if (
                        isinstance(sub, PretrainedConfig)
                        and sub.model_type in self.model_types
                        and sub.model_type not in found
                    ):
                        found.add(sub.model_type)
                        pending.append(sub.model_type)
        finally:
            logging.set_verbosity(verbosity)
        return tuple(sorted({self.model_types[t] for t in found} & set(self.models) - {module}))

    def resolve(self, name: str) -> ModelFiles:
        """The module for a model type or module name (`xlm-roberta` and `xlm_roberta` both work)."""
        module = self.model_types.get(name, name.replace("-", "_"))
        if module in self.models:
            return self.models[module]
        if module in self.model_types.values():
            raise DiscoveryError(
                f"'{name}' has no PyTorch modeling file of its own in transformers {self.version} (its folder holds "
                "configuration or tokenizer code only): nothing to rewrite; `exportsmith list --models` lists models"
            )
        known = sorted({t for t, m in self.model_types.items() if m in self.models} | set(self.models))
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `exportsmith list --models` lists them"
        raise DiscoveryError(f"unknown model '{name}' in transformers {self.version}{hint}")


def find_transformers() -> Transformers:
    """The installed transformers, located without importing it."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise DiscoveryError("transformers is not installed; install it with: pip install transformers")
    return Transformers(importlib.metadata.version("transformers"), Path(spec.origin).parent)
