"""GPT-2-style decoders probekit trains: configs, the initialization rate, a stacked forward.

probekit trains plain Hugging Face GPT-2 models (``GPT2LMHeadModel``), so every checkpoint it
writes opens in any tool. Training itself runs on a *stack* of ``M`` models that share a shape:
the parameters are held as ``{hf_name: tensor[M, ...]}`` and :func:`stacked_forward` evaluates
all ``M`` models at once with batched matrix products. A single run is a stack of one.

Initialization rate gamma: every weight matrix is drawn from ``N(0, d_in^(-2 gamma))`` (std
``d_in^-gamma``), with optional separate gammas for the embeddings (token, position and output
embedding; their ``d_in`` is ``d_model``, as in the reference code), the attention query/key
weights, the attention value/output weights and the MLP weights. Biases start at 0, layer-norm
gains at 1.

Init schemes (``ModelConfig.init_scheme``, saved with every run): ``"fan_in"`` (the default, and
every run before the field existed) uses each matrix's own ``d_in`` (``d_mlp`` for the MLP
output projection). ``"official"`` is the reference papers' code (GitHub
``sjtuzzw/complexity_control``, ``code_for_anchor_func/model/GPT2_init_for_diff_part_prenorm.py``,
``MultiHeadAttention.__init__`` (``self.fc``) and ``PoswiseFeedForwardNet.__init__`` (the last
``nn.Linear``)): ``d_model`` is the fan-in of every matrix, and the attention and MLP output
projections get an extra ``1/sqrt(2 n_layers)``. (That code also normalises only the attention
query input and leaves biases at PyTorch's default init; probekit keeps GPT-2's block.)

Example:
    >>> import torch
    >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, gamma=0.5)
    >>> params = init_stacked_params(cfg, seeds=[0, 1])
    >>> params["transformer.wte.weight"].shape
    torch.Size([2, 201, 32])
    >>> stacked_forward(params, torch.zeros(2, 3, 9, dtype=torch.long), cfg).shape
    torch.Size([2, 3, 201])
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from probekit.errors import ConfigError, check_known_keys
from probekit.training.checks import (
    DEPTH_WHY,
    MAX_LAYERS,
    check_bounded,
    check_flag,
    check_int,
    check_mapping,
    check_real,
    is_real,
)

ACTIVATIONS = ("gelu_new", "gelu", "relu", "silu")
INIT_SCHEMES: dict[str, str] = {
    "fan_in": "std d_in^-gamma for every matrix (d_mlp for the MLP output projection)",
    "official": "std d_model^-gamma for every matrix, output projections / sqrt(2 n_layers)",
}
#: token ids are 32-bit in Hugging Face models and tokenizers
VOCAB_LIMIT = 2**31

# --- paper architecture and reference-width init ---
ARCHITECTURES: dict[str, str] = {
    "gpt2": "GPT-2 block: pre-LN, biases, final LN (GPT2LMHeadModel); 4 heads, gelu_new",
    "post_ln_paper": "the anchor paper's block: post-LN, no linear biases, no final LN "
    "(OPTForCausalLM, do_layer_norm_before=False); 1 head, relu",
}
#: the defaults of ``n_heads`` and ``activation`` under each architecture (0 and "" ask for them)
ARCH_DEFAULTS: dict[str, tuple[int, str]] = {"gpt2": (4, "gelu_new"), "post_ln_paper": (1, "relu")}
#: ``d_mlp / d_model`` when ``d_mlp`` is not given (the paper: d_ff 1200 at d_model 400)
MLP_RATIOS: dict[str, int] = {"gpt2": 4, "post_ln_paper": 3}
#: OPT's learned positional embedding reads row ``position + 2`` (rows 0 and 1 are unused)
OPT_POSITION_OFFSET = 2


@dataclass
class ModelConfig:
    """Shape and initialization of a GPT-2-style decoder, or of the anchor paper's block.

    ``architecture`` is one of :data:`ARCHITECTURES`: ``"gpt2"`` (the default, and every run
    before the field existed) or ``"post_ln_paper"`` (post-LN, no linear biases, no final
    LayerNorm; saved as a post-LN ``OPTForCausalLM``). ``n_heads`` and ``activation`` left
    at 0 and "" take the architecture's (:data:`ARCH_DEFAULTS`: 4 heads and gelu_new for
    gpt2, 1 head and relu for post_ln_paper). ``d_mlp`` defaults to ``4 * d_model`` (gpt2) or
    ``3 * d_model`` (post_ln_paper, the paper's 1200 at 400). ``init_ref_width``: draw every
    matrix with the std it has at that width (see :func:`init_params`). ``gamma_emb``,
    ``gamma_qk``, ``gamma_vo`` and ``gamma_mlp`` default to ``gamma``. ``init_scheme`` is one
    of :data:`INIT_SCHEMES` (a config saved without it is ``"fan_in"``, the scheme it was
    trained with).
    ``layernorm_scaling``: LayerNorm Scaling (Sun et al. 2025), see :func:`layernorm_scales`;
    checkpoints hold it folded into the LN gains and biases.

    Example:
        >>> ModelConfig(d_model=64, n_heads=4).to_hf_config().n_inner
        256
    """

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 0
    d_mlp: int | None = None
    activation: str = ""
    vocab_size: int = 201
    n_positions: int = 9
    tie_embeddings: bool = False
    layer_norm_eps: float = 1e-5
    gamma: float = 0.5
    gamma_emb: float | None = None
    gamma_qk: float | None = None
    gamma_vo: float | None = None
    gamma_mlp: float | None = None
    init_scheme: str = "fan_in"
    layernorm_scaling: bool = False
    # --- paper architecture and reference-width init ---
    architecture: str = "gpt2"
    init_ref_width: int | None = None

    def __post_init__(self) -> None:
        if self.d_mlp is None and isinstance(self.d_model, int):
            self.d_mlp = MLP_RATIOS.get(self.architecture, 4) * self.d_model
        heads, activation = ARCH_DEFAULTS.get(self.architecture, ARCH_DEFAULTS["gpt2"])
        if self.n_heads == 0 and type(self.n_heads) is int:
            self.n_heads = heads
        if self.activation == "":
            self.activation = activation
        self.validate()

    @property
    def post_ln(self) -> bool:
        """Whether this is the paper's post-LN block (``architecture="post_ln_paper"``)."""
        return self.architecture == "post_ln_paper"

    def mlp_width(self) -> int:
        """``d_mlp``, which :meth:`__post_init__` sets to ``4 * d_model`` when not given."""
        if self.d_mlp is None:
            raise ConfigError("d_mlp is None", fix="set d_mlp, or leave it out (4 * d_model)")
        return self.d_mlp

    def validate(self) -> None:
        """Raise :class:`ConfigError` on an impossible shape or a non-finite setting."""
        for name in ("n_layers", "d_model", "n_heads", "d_mlp", "n_positions"):
            check_int(name, getattr(self, name))
        check_bounded("n_layers", self.n_layers, MAX_LAYERS, DEPTH_WHY)
        check_int("vocab_size", self.vocab_size, 1, VOCAB_LIMIT)
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}",
                fix="choose n_heads dividing d_model",
            )
        if not isinstance(self.activation, str) or self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"unknown activation {self.activation!r}", fix=f"use one of {list(ACTIVATIONS)}"
            )
        check_flag("tie_embeddings", self.tie_embeddings)
        if not isinstance(self.init_scheme, str) or self.init_scheme not in INIT_SCHEMES:
            raise ConfigError(
                f"unknown init_scheme {self.init_scheme!r}",
                fix=f"use one of {list(INIT_SCHEMES)}",
            )
        check_flag("layernorm_scaling", self.layernorm_scaling)
        self._validate_architecture()
        check_real("layer_norm_eps", self.layer_norm_eps, positive=True, example="1e-5")
        for name in ("gamma", "gamma_emb", "gamma_qk", "gamma_vo", "gamma_mlp"):
            value = getattr(self, name)
            if value is not None and not is_real(value):
                raise ConfigError(
                    f"{name} = {value!r} is not a finite number",
                    fix="use e.g. 0.3 (large init) .. 0.8 (small init)",
                )

    def _validate_architecture(self) -> None:
        """The architecture and the reference width of the init (see :data:`ARCHITECTURES`)."""
        if not isinstance(self.architecture, str) or self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"unknown architecture {self.architecture!r}",
                fix=f"use one of {list(ARCHITECTURES)}",
            )
        if self.post_ln and self.layernorm_scaling:
            raise ConfigError(
                "layernorm_scaling scales the pre-LN LayerNorms; the post_ln_paper block has none",
                fix="leave layernorm_scaling off with architecture post_ln_paper",
            )
        if self.post_ln and self.layer_norm_eps != 1e-5:
            raise ConfigError(
                f"layer_norm_eps {self.layer_norm_eps} with architecture post_ln_paper: OPT's "
                "LayerNorms have torch's fixed eps 1e-5",
                fix="leave layer_norm_eps at 1e-5",
            )
        if self.init_ref_width is not None:
            check_int("init_ref_width", self.init_ref_width)

    def n_params(self) -> int:
        """Parameters of one model, computed from the shape alone (nothing is built).

        Example:
            >>> cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2)
            >>> cfg.n_params() == sum(t.numel() for t in init_params(cfg, 0).values())
            True
        """
        d, f, v = self.d_model, self.mlp_width(), self.vocab_size
        if self.post_ln:
            return sum(math.prod(shape) for shape in self.param_shapes().values())
        per_layer = 4 * d * d + 2 * d * f + 9 * d + f
        embeddings = v * d * (1 if self.tie_embeddings else 2) + self.n_positions * d
        return self.n_layers * per_layer + embeddings + 2 * d

    def gammas(self) -> dict[str, float]:
        """The effective gamma of each parameter group (emb, qk, vo, mlp)."""
        g = float(self.gamma)
        return {
            "emb": g if self.gamma_emb is None else float(self.gamma_emb),
            "qk": g if self.gamma_qk is None else float(self.gamma_qk),
            "vo": g if self.gamma_vo is None else float(self.gamma_vo),
            "mlp": g if self.gamma_mlp is None else float(self.gamma_mlp),
        }

    def init_std(self) -> float:
        """The init std of a matrix that reads the residual stream (fan-in ``d_model``):
        ``d^-gamma`` with ``d`` = ``init_ref_width`` if set, else ``d_model`` (the
        official scheme's output projections get their extra factor on top).

        Example:
            >>> round(ModelConfig(d_model=64, gamma=0.5, init_ref_width=400).init_std(), 4)
            0.05
        """
        return float(self.init_ref_width or self.d_model) ** -float(self.gamma)

    def shape_key(self) -> tuple:
        """Everything but the initialization: runs with equal keys can be stacked."""
        arch = () if self.architecture == "gpt2" else (self.architecture,)
        return arch + (
            self.n_layers,
            self.d_model,
            self.n_heads,
            self.d_mlp,
            self.activation,
            self.vocab_size,
            self.n_positions,
            self.tie_embeddings,
            self.layer_norm_eps,
            self.layernorm_scaling,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`ConfigError`."""
        d = check_mapping("model", d)
        check_known_keys(d, {f.name for f in fields(cls)}, "model")
        return cls(**d)

    def to_hf_config(self):
        """The matching ``transformers.GPT2Config`` (dropout off), or ``OPTConfig`` for the
        post_ln_paper architecture (:func:`post_ln_config`)."""
        if self.post_ln:
            return post_ln_config(self)
        return gpt2_config(
            vocab_size=self.vocab_size,
            n_positions=self.n_positions,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_mlp=self.d_mlp,
            activation_function=self.activation,
            layer_norm_epsilon=self.layer_norm_eps,
            tie_word_embeddings=self.tie_embeddings,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF parameter names and shapes of one model, in a fixed order."""
        if self.post_ln:
            return post_ln_shapes(self)
        d, f, v = self.d_model, self.mlp_width(), self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {
            "transformer.wte.weight": (v, d),
            "transformer.wpe.weight": (self.n_positions, d),
        }
        for i in range(self.n_layers):
            p = f"transformer.h.{i}."
            shapes.update(
                {
                    p + "ln_1.weight": (d,),
                    p + "ln_1.bias": (d,),
                    p + "attn.c_attn.weight": (d, 3 * d),
                    p + "attn.c_attn.bias": (3 * d,),
                    p + "attn.c_proj.weight": (d, d),
                    p + "attn.c_proj.bias": (d,),
                    p + "ln_2.weight": (d,),
                    p + "ln_2.bias": (d,),
                    p + "mlp.c_fc.weight": (d, f),
                    p + "mlp.c_fc.bias": (f,),
                    p + "mlp.c_proj.weight": (f, d),
                    p + "mlp.c_proj.bias": (d,),
                }
            )
        shapes["transformer.ln_f.weight"] = (d,)
        shapes["transformer.ln_f.bias"] = (d,)
        if not self.tie_embeddings:
            shapes["lm_head.weight"] = (v, d)
        return shapes


def decays(name: str) -> bool:
    """Whether weight decay applies to a parameter (weight matrices and embeddings only)."""
    return name.endswith("weight") and "ln_" not in name and "layer_norm" not in name


def init_params(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """One model's parameters drawn with the initialization rate; same seed, same weights.

    Every weight matrix is drawn with std ``fan^-gamma`` (its group's gamma), ``fan`` its
    fan-in under the init scheme (:data:`INIT_SCHEMES`). With ``init_ref_width`` set, ``fan``
    is the fan-in the same matrix has in the model of width ``init_ref_width``:
    ``fan * init_ref_width / d_model`` (so ``init_ref_width^-gamma`` for every matrix that
    reads the residual stream, ``(d_mlp / d_model * init_ref_width)^-gamma`` for the MLP output
    projection under ``"fan_in"``); the official scheme's ``1/sqrt(2 n_layers)`` stays.

    Example:
        >>> p = init_params(ModelConfig(d_model=64, gamma=0.5), seed=0)
        >>> round(float(p["transformer.h.0.mlp.c_fc.weight"].std()), 2)  # 64 ** -0.5
        0.12
        >>> q = init_params(ModelConfig(d_model=64, gamma=0.5, init_scheme="official"), seed=0)
        >>> round(float(q["transformer.h.0.mlp.c_proj.weight"].std()), 3)  # 64**-0.5 / sqrt(4)
        0.062
    """
    gen = torch.Generator().manual_seed(int(seed))
    g = cfg.gammas()
    d = cfg.d_model
    out: dict[str, torch.Tensor] = {}
    for name, shape in cfg.param_shapes().items():
        if not decays(name):  # LayerNorm gains start at 1, biases at 0
            out[name] = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
            continue
        w = torch.randn(shape, generator=gen)
        if name.endswith("attn.c_attn.weight"):
            w[:, : 2 * d].mul_(_fan(cfg, d) ** -g["qk"])
            w[:, 2 * d :].mul_(_fan(cfg, d) ** -g["vo"])
        else:
            group, d_in, scale = _init_role(cfg, name)
            w.mul_(_fan(cfg, d_in) ** -g[group] * scale)
        out[name] = w
    return out


def _fan(cfg: ModelConfig, d_in: int) -> float:
    """The fan-in the init uses for a matrix whose own fan-in is ``d_in``: ``d_in`` itself,
    or under ``init_ref_width`` the fan-in of the same matrix in the reference-width model,
    ``d_in * init_ref_width / d_model``."""
    if cfg.init_ref_width is None:
        return d_in
    return d_in * cfg.init_ref_width / cfg.d_model


def _init_role(cfg: ModelConfig, name: str) -> tuple[str, int, float]:
    """``(gamma group, fan-in, extra factor)`` of the weight matrix ``name`` under the
    config's init scheme (see :data:`INIT_SCHEMES`)."""
    d = cfg.d_model
    official = cfg.init_scheme == "official"
    out_scale = (2 * cfg.n_layers) ** -0.5 if official else 1.0
    mlp_in = d if official else cfg.mlp_width()
    roles = {
        ("wte.weight", "wpe.weight", "lm_head.weight", "embed_tokens.weight"): ("emb", d, 1.0),
        ("embed_positions.weight",): ("emb", d, 1.0),
        ("q_proj.weight", "k_proj.weight"): ("qk", d, 1.0),
        ("v_proj.weight",): ("vo", d, 1.0),
        ("attn.c_proj.weight", "out_proj.weight"): ("vo", d, out_scale),
        ("mlp.c_fc.weight", "fc1.weight"): ("mlp", d, 1.0),
        ("mlp.c_proj.weight", "fc2.weight"): ("mlp", mlp_in, out_scale),
    }
    for ends, role in roles.items():
        if name.endswith(ends):
            return role
    raise AssertionError(name)  # pragma: no cover - every weight is listed above


def init_stacked_params(
    cfg: ModelConfig | list[ModelConfig], seeds: list[int]
) -> dict[str, torch.Tensor]:
    """Stack :func:`init_params` of each (config, seed) along a leading model dimension.

    ``cfg`` may be one config (shared) or one per seed (same shape, different gammas).
    """
    cfgs = cfg if isinstance(cfg, list) else [cfg] * len(seeds)
    if len(cfgs) != len(seeds):
        raise ConfigError(
            f"{len(cfgs)} configs for {len(seeds)} seeds", fix="pass one config per seed"
        )
    if len({c.shape_key() for c in cfgs}) != 1:
        raise ConfigError(
            "stacked models must share one shape", fix="group runs by ModelConfig.shape_key()"
        )
    singles = [init_params(c, s) for c, s in zip(cfgs, seeds, strict=False)]
    return {k: torch.stack([p[k] for p in singles]) for k in singles[0]}


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "gelu_new":  # GPT-2's tanh approximation (HF NewGELU), as one fused kernel
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    if name == "relu":
        return F.relu(x)
    return F.silu(x)


def layernorm_scales(n_layers: int) -> dict[str, float]:
    """LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models"): the
    factor ``1/sqrt(l)`` of the pre-attention and pre-MLP LayerNorm outputs of the layer at depth
    ``l = 1 .. L`` (0-based index ``i``: ``1/sqrt(i + 1)``; the final LayerNorm is not scaled).

    Returns ``{HF parameter name: factor}`` for the gains and biases it multiplies: scaling the
    output of ``LN(x) * g + b`` is scaling ``g`` and ``b``, which is how both trainers apply it
    (:func:`scale_layernorm` on the trained, unscaled gains) and how a checkpoint stores it
    (folded: a plain GPT-2 whose forward is the scaled model's).

    Example:
        >>> s = layernorm_scales(4)
        >>> s["transformer.h.0.ln_1.weight"], s["transformer.h.3.ln_2.bias"]
        (1.0, 0.5)
    """
    out = {}
    for i in range(n_layers):
        for ln in ("ln_1", "ln_2"):
            for kind in ("weight", "bias"):
                out[f"transformer.h.{i}.{ln}.{kind}"] = 1.0 / math.sqrt(i + 1)
    return out


def scale_layernorm(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor * factor`` as one multiplication in ``tensor``'s dtype, the same on every
    device: the training forward and the folded checkpoint compute the gains this one way."""
    return tensor * torch.tensor(factor, dtype=tensor.dtype, device=tensor.device)


def _ln(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    # x [M, N, d]; w, b [M, d]
    y = F.layer_norm(x, (x.shape[-1],), eps=eps)
    return y * w[:, None, :] + b[:, None, :]


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # x [M, N, d_in]; w [M, d_in, d_out] (HF Conv1D layout); b [M, d_out]
    return torch.baddbmm(b[:, None, :], x, w)


def stacked_forward(
    params: dict[str, torch.Tensor],
    tokens: torch.Tensor,
    cfg: ModelConfig,
    last_only: bool = True,
) -> torch.Tensor:
    """Logits of ``M`` stacked GPT-2 models on ``tokens`` ``[M, B, T]``.

    Returns ``[M, B, vocab]`` (last position) or ``[M, B, T, vocab]`` when ``last_only`` is
    False. Numerically it is the Hugging Face GPT-2 forward (eager attention) of each model.
    """
    wte = params["model.decoder.embed_tokens.weight" if cfg.post_ln else "transformer.wte.weight"]
    M, V, d = wte.shape
    if tokens.dim() != 3 or tokens.shape[0] != M:
        raise ConfigError(
            f"tokens of shape {tuple(tokens.shape)} for {M} stacked models",
            fix="pass tokens [M, batch, seq]",
        )
    _, B, T = tokens.shape
    if cfg.post_ln:
        return _post_ln_forward(params, tokens, cfg, last_only)
    H = cfg.n_heads
    hd = d // H
    eps = cfg.layer_norm_eps
    offs = (torch.arange(M, device=tokens.device) * V)[:, None, None]
    h = wte.reshape(M * V, d)[tokens + offs]  # [M, B, T, d]
    h = h + params["transformer.wpe.weight"][:, None, :T, :]
    h = h.reshape(M, B * T, d)
    ln = _scaled_layernorms(params, cfg)
    for i in range(cfg.n_layers):
        p = f"transformer.h.{i}."
        last_layer = last_only and i == cfg.n_layers - 1
        x = _ln(h, ln[p + "ln_1.weight"], ln[p + "ln_1.bias"], eps)
        qkv = _linear(x, params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"])
        q, k, v = qkv.view(M * B, T, 3, H, hd).permute(2, 0, 3, 1, 4)  # each [M*B, H, T, hd]
        if last_layer:
            # only the last position is read out: attend from it alone, to every position
            a = F.scaled_dot_product_attention(q[:, :, -1:], k, v)  # [M*B, H, 1, hd]
            a = a.transpose(1, 2).reshape(M, B, d)
            h = h.view(M, B, T, d)[:, :, -1]
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(M, B * T, d)
        h = h + _linear(a, params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"])
        x = _ln(h, ln[p + "ln_2.weight"], ln[p + "ln_2.bias"], eps)
        x = _act(
            cfg.activation, _linear(x, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"])
        )
        h = h + _linear(x, params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"])
    h = _ln(h, params["transformer.ln_f.weight"], params["transformer.ln_f.bias"], eps)
    unembed = params["transformer.wte.weight" if cfg.tie_embeddings else "lm_head.weight"]
    logits = torch.bmm(h, unembed.transpose(1, 2))
    return logits if last_only else logits.view(M, B, T, V)


# --- paper architecture and reference-width init ---
def post_ln_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF ``OPTForCausalLM`` parameter names and shapes of the post_ln_paper model, in a fixed
    order: no linear biases, no final LayerNorm, positions in rows ``2 ..`` of a learned table.

    Example:
        >>> shapes = post_ln_shapes(ModelConfig(architecture="post_ln_paper", d_model=8))
        >>> shapes["model.decoder.embed_positions.weight"], len(shapes)
        ((11, 8), 23)
    """
    d, f, v = cfg.d_model, cfg.mlp_width(), cfg.vocab_size
    top = "model.decoder."
    shapes: dict[str, tuple[int, ...]] = {
        top + "embed_tokens.weight": (v, d),
        top + "embed_positions.weight": (cfg.n_positions + OPT_POSITION_OFFSET, d),
    }
    for i in range(cfg.n_layers):
        p = f"{top}layers.{i}."
        shapes.update({p + f"self_attn.{x}_proj.weight": (d, d) for x in ("q", "k", "v", "out")})
        shapes.update(
            {
                p + "self_attn_layer_norm.weight": (d,),
                p + "self_attn_layer_norm.bias": (d,),
                p + "fc1.weight": (f, d),
                p + "fc2.weight": (d, f),
                p + "final_layer_norm.weight": (d,),
                p + "final_layer_norm.bias": (d,),
            }
        )
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (v, d)
    return shapes


def post_ln_config(cfg: ModelConfig):
    """The ``transformers.OPTConfig`` of the post_ln_paper model: post-LN
    (``do_layer_norm_before=False``, which also drops OPT's final LayerNorm), no linear biases,
    dropout off."""
    from transformers import OPTConfig

    return OPTConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        ffn_dim=cfg.mlp_width(),
        num_attention_heads=cfg.n_heads,
        max_position_embeddings=cfg.n_positions,
        word_embed_proj_dim=cfg.d_model,
        do_layer_norm_before=False,
        enable_bias=False,
        layer_norm_elementwise_affine=True,
        activation_function=cfg.activation,
        dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        architectures=["OPTForCausalLM"],
    )


def _dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # x [M, N, d_in]; w [M, d_out, d_in] (nn.Linear layout)
    return torch.bmm(x, w.transpose(1, 2))


def _post_ln_forward(
    params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: ModelConfig, last_only: bool
) -> torch.Tensor:
    """:func:`stacked_forward` of the post_ln_paper block:
    ``h = LN1(h + attn(h)); h = LN2(h + mlp(h))``, no biases, no final LayerNorm (the HF OPT
    forward with ``do_layer_norm_before=False``)."""
    top = "model.decoder."
    wte = params[top + "embed_tokens.weight"]
    M, V, d = wte.shape
    _, B, T = tokens.shape
    H, eps = cfg.n_heads, cfg.layer_norm_eps
    hd = d // H
    offs = (torch.arange(M, device=tokens.device) * V)[:, None, None]
    h = wte.reshape(M * V, d)[tokens + offs]  # [M, B, T, d]
    pos = params[top + "embed_positions.weight"][:, OPT_POSITION_OFFSET : OPT_POSITION_OFFSET + T]
    h = (h + pos[:, None]).reshape(M, B * T, d)
    for i in range(cfg.n_layers):
        p = f"{top}layers.{i}."
        q, k, v = (
            _dense(h, params[p + f"self_attn.{x}_proj.weight"])
            .view(M * B, T, H, hd)
            .transpose(1, 2)
            for x in ("q", "k", "v")
        )
        if last_only and i == cfg.n_layers - 1:
            a = F.scaled_dot_product_attention(q[:, :, -1:], k, v).transpose(1, 2).reshape(M, B, d)
            h = h.view(M, B, T, d)[:, :, -1]
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(M, B * T, d)
        h = h + _dense(a, params[p + "self_attn.out_proj.weight"])
        h = _ln(
            h,
            params[p + "self_attn_layer_norm.weight"],
            params[p + "self_attn_layer_norm.bias"],
            eps,
        )
        x = _act(cfg.activation, _dense(h, params[p + "fc1.weight"]))
        h = h + _dense(x, params[p + "fc2.weight"])
        h = _ln(h, params[p + "final_layer_norm.weight"], params[p + "final_layer_norm.bias"], eps)
    unembed = params[top + "embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"]
    logits = torch.bmm(h, unembed.transpose(1, 2))
    return logits if last_only else logits.view(M, B, T, V)


def _scaled_layernorms(params: dict[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """The layers' LN gains and biases as the forward uses them (scaled under LayerNorm
    Scaling, else as they are)."""
    if not cfg.layernorm_scaling:
        return params
    scales = layernorm_scales(cfg.n_layers)
    return {k: scale_layernorm(params[k], f) for k, f in scales.items()}


def gpt2_config(
    *,
    vocab_size: int,
    n_positions: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_mlp: int | None,
    **settings: Any,
):
    """The ``transformers.GPT2Config`` both trainers build: the shape, dropout off, plus
    ``settings`` (any other GPT2Config field).

    Example:
        >>> gpt2_config(vocab_size=10, n_positions=8, d_model=16, n_layers=1, n_heads=2,
        ...             d_mlp=None).resid_pdrop
        0.0
    """
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        n_inner=d_mlp,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **settings,
    )


def to_hf_model(cfg: ModelConfig, params: dict[str, torch.Tensor], index: int = 0, model=None):
    """Model ``index`` of a stack as a ``transformers.GPT2LMHeadModel`` (eval mode, CPU).

    Pass ``model`` (a GPT2LMHeadModel of the same shape) to fill it instead of building one.
    Under ``cfg.layernorm_scaling`` the scale is folded into the LN gains and biases, so the
    plain GPT-2 computes the scaled model (:func:`from_hf_model` reads it back as that plain
    model; the trainers keep the unscaled gains beside the checkpoint to resume from).
    """
    from transformers import GPT2LMHeadModel, OPTForCausalLM

    if model is None:
        klass = OPTForCausalLM if cfg.post_ln else GPT2LMHeadModel
        model = klass(cfg.to_hf_config())
    one = {k: v[index].detach() for k, v in params.items()}
    one.update(_scaled_layernorms(one, cfg))
    state = {k: v.to("cpu", torch.float32) for k, v in one.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if real_missing or unexpected:  # pragma: no cover - guarded by tests
        raise ConfigError(
            f"parameter mismatch: missing {real_missing}, unexpected {unexpected}",
            fix="report this as a probekit bug",
        )
    return model.eval()


def from_hf_model(model) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A GPT2LMHeadModel (or the post_ln_paper OPTForCausalLM) as (config, stack of one) --
    the inverse of :func:`to_hf_model`."""
    c = model.config
    if getattr(c, "model_type", "") == "opt":
        cfg = _post_ln_from_hf(c)
    else:
        cfg = _gpt2_from_hf(c)
    sd = model.state_dict()
    params = {k: sd[k].detach().clone()[None].float() for k in cfg.param_shapes()}
    return cfg, params


def _post_ln_from_hf(c: Any) -> ModelConfig:
    """The post_ln_paper config of an ``OPTConfig``; other OPT settings are refused."""
    if c.do_layer_norm_before or c.enable_bias or c.word_embed_proj_dim != c.hidden_size:
        raise ConfigError(
            "this OPT model is not a post_ln_paper model (pre-LN, biases or a projected embedding)",
            fix="read only post_ln_paper checkpoints as a trainer config",
        )
    return ModelConfig(
        architecture="post_ln_paper",
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        d_mlp=c.ffn_dim,
        activation=c.activation_function,
        vocab_size=c.vocab_size,
        n_positions=c.max_position_embeddings,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
    )


def _gpt2_from_hf(c: Any) -> ModelConfig:
    """The config of a ``GPT2Config``."""
    return ModelConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        activation=c.activation_function,
        vocab_size=c.vocab_size,
        n_positions=c.n_positions,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
        layer_norm_eps=c.layer_norm_epsilon,
    )
