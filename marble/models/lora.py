"""LoRA adapters on the SD3 transformer (docs/algorithm.md §5, §6).

Two peft adapters live side by side: "default" (trainable, the policy v_theta) and
"old" (the rollout policy, a decayed copy of "default"). With adapters disabled the
transformer is the frozen base model, i.e. the KL reference.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor, nn

from marble.runtime.io import atomic_path
from marble.runtime.seeds import STREAM_LORA_INIT, stable_seed

TRAINABLE = "default"
OLD = "old"
DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_BIN_WEIGHTS_FILE = "adapter_model.bin"  # older peft / the reference's hub LoRAs


def _lora_layers(transformer) -> Iterator[tuple[str, nn.Module]]:
    from peft.tuners.lora import LoraLayer

    for name, module in transformer.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def _fix_requires_grad(transformer) -> None:
    """Only "default" trains. peft's set_adapter / enable_adapters reset requires_grad
    to the *active* adapter, so it is re-imposed after every switch (docs/measurements.md)."""
    for _, layer in _lora_layers(transformer):
        for adapter_name in list(layer.lora_A.keys()):
            trainable = adapter_name == TRAINABLE
            layer.lora_A[adapter_name].requires_grad_(trainable)
            layer.lora_B[adapter_name].requires_grad_(trainable)


def add_lora_adapters(transformer, rank: int, alpha: float, targets: list[str],
                      seed: int | None = None) -> None:
    """Add "default" (trainable, Gaussian init: A ~ N(0, 1/r), B = 0) and "old" (a copy)."""
    from peft import LoraConfig

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                        init_lora_weights="gaussian")
    # Seeded in a forked RNG so adapter init is reproducible and leaves the global stream alone.
    with torch.random.fork_rng(devices=[]):
        if seed is not None:  # keyed like every other stream (marble/runtime/seeds.py)
            torch.manual_seed(stable_seed(seed, STREAM_LORA_INIT))
        transformer.add_adapter(config, adapter_name=TRAINABLE)
        with warnings.catch_warnings():  # peft warns that a second adapter is being added: intended
            warnings.filterwarnings("ignore", message=".*multiple adapters.*")
            transformer.add_adapter(config, adapter_name=OLD)
    # LoRA weights train in fp32 even on a bf16/fp16 base (as the reference's
    # cast_training_params); peft casts the adapter input/output around them.
    for _, layer in _lora_layers(transformer):
        for bank in (layer.lora_A, layer.lora_B):
            bank.to(torch.float32)
    load_adapter_state(transformer, OLD, adapter_state(transformer, TRAINABLE))
    transformer.set_adapter(TRAINABLE)
    _fix_requires_grad(transformer)


def trainable_lora_parameters(transformer) -> list[nn.Parameter]:
    """The "default" adapter's parameters, in module order (stable across processes)."""
    params = []
    for _, layer in _lora_layers(transformer):
        if TRAINABLE in layer.lora_A:
            params += [layer.lora_A[TRAINABLE].weight, layer.lora_B[TRAINABLE].weight]
    for p in params:
        p.requires_grad_(True)
    return params


def adapter_state(transformer, name: str) -> dict[str, Tensor]:
    """A detached copy of adapter `name`: {"<module>.lora_A.weight": W, ...} (peft key style)."""
    state = {}
    for module_name, layer in _lora_layers(transformer):
        if name not in layer.lora_A:
            raise KeyError(f"adapter {name!r} is not on {module_name}; adapters: {list(layer.lora_A)}")
        state[f"{module_name}.lora_A.weight"] = layer.lora_A[name].weight.detach().clone()
        state[f"{module_name}.lora_B.weight"] = layer.lora_B[name].weight.detach().clone()
    return state


@torch.no_grad()
def load_adapter_state(transformer, name: str, state: dict[str, Tensor]) -> None:
    """Copy `state` (adapter_state's key format) into adapter `name`; keys must match exactly."""
    targets = {}
    for module_name, layer in _lora_layers(transformer):
        targets[f"{module_name}.lora_A.weight"] = layer.lora_A[name].weight
        targets[f"{module_name}.lora_B.weight"] = layer.lora_B[name].weight
    missing, unexpected = sorted(set(targets) - set(state)), sorted(set(state) - set(targets))
    if missing or unexpected:
        raise KeyError(f"adapter state for {name!r} does not match the model: "
                       f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                       f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    for key, param in targets.items():
        param.copy_(state[key].to(dtype=param.dtype, device=param.device))


@torch.no_grad()
def blend_adapter(transformer, dst: str = OLD, src: str = TRAINABLE, decay: float = 0.0) -> None:
    """dst <- decay * dst + (1 - decay) * src, in place (old-policy update, docs/algorithm.md
    §5)."""
    for _, layer in _lora_layers(transformer):
        for bank in (layer.lora_A, layer.lora_B):
            bank[dst].weight.mul_(decay).add_(bank[src].weight, alpha=1.0 - decay)


# Adapter switching in O(1) Python work (issue 19): peft's set_adapter / disable_adapters
# walk every module (3,524 on SD3.5 Medium, ~40 ms of CPU, three times a micro-step). Every
# LoRA layer instead holds the same `_active_adapter` list object, so one in-place edit of
# that list switches them all; an empty list is the frozen base (peft's forward then runs
# only `base_layer`, exactly its disabled path). requires_grad is never touched by a
# switch: "default" stays the only trainable adapter. The attributes are peft's private ones,
# so pyproject.toml bounds peft to the versions tests/test_lora_switch.py checked them on.
_SHARED = "_marble_active_adapters"
_FIRST = "_marble_first_lora_layer"


def _shared_active(transformer) -> list:
    """The list every LoRA layer reads its active adapters from; (re)installed in one
    walk when missing or when peft's own set_adapter / disable_adapters replaced it."""
    shared, first = getattr(transformer, _SHARED, None), getattr(transformer, _FIRST, None)
    if shared is not None and first._active_adapter is shared and not first._disable_adapters:
        return shared
    layers = [layer for _, layer in _lora_layers(transformer)]
    if not layers:
        raise KeyError("the transformer has no LoRA adapters")
    shared = [] if layers[0]._disable_adapters else list(layers[0].active_adapters)
    for layer in layers:
        layer._active_adapter = shared
        layer._disable_adapters = False
    object.__setattr__(transformer, _SHARED, shared)  # plain attributes, not submodules
    object.__setattr__(transformer, _FIRST, layers[0])
    return shared


@contextlib.contextmanager
def _active(transformer, names: list[str]):
    shared = _shared_active(transformer)
    first = getattr(transformer, _FIRST)
    unknown = [n for n in names if n not in first.lora_A]
    if unknown:  # peft's forward would silently skip it: the base model, not an error
        raise KeyError(f"adapter {unknown[0]!r} is not on the transformer; adapters: "
                       f"{list(first.lora_A)}")
    previous = list(shared)
    shared[:] = names
    try:
        yield transformer
    finally:
        shared[:] = previous


def use_adapter(transformer, name: str):
    """Run the transformer with adapter `name` active; restore the previous one after."""
    return _active(transformer, [name])


def adapters_disabled(transformer):
    """Run the frozen base model (the KL reference policy, docs/algorithm.md §5)."""
    return _active(transformer, [])


def lora_config_dict(transformer, adapter: str = TRAINABLE) -> dict:
    """The peft LoraConfig of `adapter` as a JSON-able dict (rank, alpha, targets)."""
    config = transformer.peft_config[adapter].to_dict()
    return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


# The safetensors metadata key of a LoRA's provenance (its run's identity: the base model's
# fingerprint, config digest, seed): a LoRA copied out of its run still says which base it
# belongs to, and evaluation refuses it on another (marble.evaluation.identity).
PROVENANCE_KEY = "marble_provenance"


def save_lora_diffusers(transformer, out_dir: str | os.PathLike, adapter: str = TRAINABLE,
                        state: dict[str, Tensor] | None = None, provenance: dict | None = None) -> Path:
    """Write `pytorch_lora_weights.safetensors` that `pipe.load_lora_weights(out_dir)` loads.

    `state` (adapter_state format) overrides the live weights, e.g. EMA weights. The
    rank/alpha go in the file's metadata, so diffusers scales by alpha/r as we do;
    `provenance` (JSON) goes there too, under PROVENANCE_KEY.
    """
    from diffusers import StableDiffusion3Pipeline

    weights = {k: v.detach().cpu().contiguous()
               for k, v in (state if state is not None else adapter_state(transformer, adapter)).items()}
    out = Path(out_dir)
    with atomic_path(out) as tmp:
        StableDiffusion3Pipeline.save_lora_weights(
            tmp, transformer_lora_layers=weights,
            transformer_lora_adapter_metadata=lora_config_dict(transformer, adapter))
        if provenance is not None:
            _add_metadata(tmp / DIFFUSERS_LORA_FILE, {PROVENANCE_KEY: json.dumps(provenance, sort_keys=True)})
    return out


def _add_metadata(path: Path, extra: dict[str, str]) -> None:
    """Rewrite a safetensors file with `extra` added to its header metadata (diffusers'
    save_lora_weights takes no metadata of ours; a LoRA is megabytes, so a rewrite is cheap)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        metadata = dict(fh.metadata() or {})
    save_file(tensors, str(path), metadata={**metadata, **extra})


def lora_provenance(folder: str | os.PathLike) -> dict | None:
    """The provenance a diffusers LoRA folder's weights file records (save_lora_diffusers),
    None for a LoRA without one (another tool's, or marble's before it recorded one)."""
    from safetensors import safe_open

    path = Path(folder) / DIFFUSERS_LORA_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as fh:
        text = (fh.metadata() or {}).get(PROVENANCE_KEY)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        raise LoraMismatchError(f"LoRA {path}: its {PROVENANCE_KEY} metadata is not JSON") from None
    return value if isinstance(value, dict) else None


def _peft_weights_file(folder: Path) -> Path | None:
    for name in (PEFT_WEIGHTS_FILE, PEFT_BIN_WEIGHTS_FILE):
        if (folder / name).is_file():
            return folder / name
    return None


def read_peft_weights(path: Path) -> dict[str, Tensor]:
    """A peft adapter state dict: safetensors, or a .bin read with weights_only=True."""
    if path.suffix == ".bin":
        # weights_only: a tensor dict loads, arbitrary pickled code does not.
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise ValueError(f"{path}: expected a dict of tensors (a peft adapter state dict)")
        return state
    from safetensors.torch import load_file

    return load_file(str(path))


def _load_peft_folder(pipe, folder: Path, adapter_name: str) -> None:
    from peft import LoraConfig

    config = json.loads((folder / PEFT_CONFIG_FILE).read_text())
    known = set(LoraConfig.__dataclass_fields__)
    lora_config = LoraConfig(**{k: v for k, v in config.items() if k in known and k != "peft_type"})
    raw = read_peft_weights(_peft_weights_file(folder))
    # peft's save_pretrained prefixes keys with "base_model.model." and drops the adapter name.
    state = {k.removeprefix("base_model.model.").replace(f".{adapter_name}.", "."): v
             for k, v in raw.items()}
    pipe.transformer.add_adapter(lora_config, adapter_name=adapter_name)
    load_adapter_state(pipe.transformer, adapter_name, state)
    pipe.transformer.set_adapter(adapter_name)


TEXT_ENCODER_PREFIXES = ("text_encoder.", "text_encoder_2.", "text_encoder_3.")


class LoraMismatchError(ValueError):
    """A LoRA file that does not fit the base model it is loaded into; names the file."""


def lora_file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """key -> shape of a safetensors LoRA file, from its header (no tensor is read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return {key: tuple(fh.get_slice(key).get_shape()) for key in fh.keys()}


def match_lora_keys(transformer, shapes: dict[str, tuple[int, ...]], source: Path) -> tuple[int, list[str]]:
    """(modules of `transformer` the LoRA's keys address, unexpected keys); LoraMismatchError
    for a key whose shape does not fit its module (a LoRA of another base architecture).

    A diffusers/peft LoRA key is `[transformer.|base_model.model.]<module>.lora_A|lora_B[.<adapter>].weight`;
    lora_A is [r, in_features], lora_B [out_features, r] of the module's linear layer.
    """
    modules = dict(transformer.named_modules())
    matched, unexpected = set(), []
    for key, shape in sorted(shapes.items()):
        stem = key.removeprefix("transformer.").removeprefix("base_model.model.")
        if ".lora_A" not in stem and ".lora_B" not in stem:
            unexpected.append(key)
            continue
        kind = "lora_A" if ".lora_A" in stem else "lora_B"
        name = stem.split(f".{kind}", 1)[0]
        module = modules.get(name)
        module = getattr(module, "base_layer", module)
        if not isinstance(module, nn.Linear):
            unexpected.append(key)
            continue
        want = module.in_features if kind == "lora_A" else module.out_features
        got = shape[1] if kind == "lora_A" else shape[0]
        if len(shape) != 2 or got != want:
            raise LoraMismatchError(
                f"LoRA {source}: {key} has shape {list(shape)}, but {name} of the base model is "
                f"{module.in_features} -> {module.out_features}: this LoRA belongs to another base model")
        matched.add(name)
    return len(matched), unexpected


def _checked_match(pipe, weights: Path, shapes: dict) -> int:
    matched, unexpected = match_lora_keys(pipe.transformer, shapes, weights)
    if matched == 0:
        raise LoraMismatchError(f"LoRA {weights}: none of its {len(shapes)} keys matches a layer of the base "
                                f"model (e.g. {sorted(shapes)[:1]}): it belongs to another model")
    # Text-encoder keys are diffusers' to load; any other key naming no layer of the base was
    # dropped with a warning and the rest scored as the LoRA: part of a LoRA is refused.
    unmatched = [k for k in unexpected if not k.startswith(TEXT_ENCODER_PREFIXES)]
    if unmatched:
        raise LoraMismatchError(f"LoRA {weights}: {len(unmatched)} of its {len(shapes)} keys name modules the "
                                f"base model lacks (e.g. {unmatched[:3]}); {matched} layers would load, the rest "
                                "not: a LoRA of another variant of this model, refused rather than scored in part")
    return matched


def _loaded_layers(transformer, adapter_name: str) -> int:
    return sum(1 for _, layer in _lora_layers(transformer) if adapter_name in layer.lora_A)


def load_lora_into_pipeline(pipe, path: str | os.PathLike, adapter_name: str = "marble"):
    """Load a LoRA into `pipe` and activate it, from one of three folder kinds:

    a marble checkpoint (has `lora/`), a diffusers LoRA folder
    (`pytorch_lora_weights.safetensors`) or a peft folder (`adapter_config.json` +
    `adapter_model.safetensors` or `adapter_model.bin`).
    """
    folder = Path(path).expanduser()
    if (folder / "lora").is_dir():
        folder = folder / "lora"
    # Keys are matched against the base model first (a LoRA that matches nothing would
    # evaluate as the base model, exit 0), and the loaded layers counted after.
    if (folder / DIFFUSERS_LORA_FILE).is_file():
        weights = folder / DIFFUSERS_LORA_FILE
        matched = _checked_match(pipe, weights, lora_file_shapes(weights))
        pipe.load_lora_weights(str(folder), adapter_name=adapter_name)
    elif (folder / PEFT_CONFIG_FILE).is_file() and _peft_weights_file(folder) is not None:
        weights = _peft_weights_file(folder)
        shapes = ({k: tuple(v.shape) for k, v in read_peft_weights(weights).items()}
                  if weights.suffix == ".bin" else lora_file_shapes(weights))
        matched = _checked_match(pipe, weights, shapes)
        try:
            _load_peft_folder(pipe, folder, adapter_name)
        except (KeyError, ValueError, RuntimeError) as exc:  # peft: targets absent; ours: keys differ
            raise LoraMismatchError(f"LoRA {weights} does not load into the base model: "
                                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    else:
        matched = None
    if matched is not None:
        loaded = _loaded_layers(pipe.transformer, adapter_name)
        if loaded < matched:
            raise LoraMismatchError(f"LoRA {weights}: {matched} layers matched but {loaded} loaded")
        return pipe
    raise FileNotFoundError(
        f"no LoRA found in {str(path)!r}: looked for a marble checkpoint (lora/ subfolder), "
        f"{DIFFUSERS_LORA_FILE} (diffusers) or {PEFT_CONFIG_FILE} + {PEFT_WEIGHTS_FILE} or "
        f"{PEFT_BIN_WEIGHTS_FILE} (peft)"
        + ("" if folder.is_dir() else " — the folder does not exist"))


class AdapterStates:
    """Named adapters of a transformer as one stateful object (the checkpoint manager's
    "adapters" state): {adapter: adapter_state(...)}; a load needs exactly these names."""

    def __init__(self, transformer, names: tuple[str, ...] = (TRAINABLE, OLD)):
        self.transformer, self.names = transformer, tuple(names)

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        return {name: adapter_state(self.transformer, name) for name in self.names}

    def load_state_dict(self, states: dict[str, dict[str, Tensor]]) -> None:
        if sorted(states) != sorted(self.names):
            raise KeyError(f"adapters {sorted(states)} where this run has {sorted(self.names)}")
        for name in self.names:
            load_adapter_state(self.transformer, name, states[name])


def merge_lora(model) -> int:
    """Merge every active LoRA adapter of `model` into its base weights, in the weights' own
    dtype (peft's public BaseTunerLayer.merge): the reference merges into the fp32 transformer
    before casting, so the delta is added at full precision. Returns the layers merged."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = 0
    for module in model.modules():
        if isinstance(module, BaseTunerLayer) and not module.merged:
            module.merge()
            merged += 1
    return merged
