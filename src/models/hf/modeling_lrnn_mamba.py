# coding=utf-8
"""Mamba (Mamba-1) with the eigenvalue range [-1, 1] for Hugging Face transformers.

The lrnn engine (`lrnn train`) writes this file next to `config.json` in a run directory whose
Mamba has `allow_neg_eigval: true`. Stock transformers has no such model: its
`MambaForCausalLM` always computes abar = exp(delta * A), in [0, 1]: it would load these weights
(the names are the same) but compute a different network. So `config.json` names this file's classes
(`model_type: lrnn_mamba`, `auto_map`), and the run loads with

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(run_dir, trust_remote_code=True)

The math (lrnn's src/models/mamba.h; parameter names as HF's MambaForCausalLM):
    h = embeddings(tokens)
    per layer:  h += mixer(RMSNorm(h))                      backbone.layers.{i}.norm / .mixer
    logits = lm_head(RMSNorm(h))                            backbone.norm_f, lm_head (untied)
Mixer, d_inner = expand * hidden_size, R = time_step_rank, N = state_size:
    x, z     = split(in_proj(u))                           in_proj: d -> 2 d_inner (x | z)
    x        = SiLU(causal depthwise conv1d(x) + bias)     kernel conv_kernel
    dt, B, C = split(x_proj(x))                            x_proj: d_inner -> R + 2N
    delta    = softplus(dt_proj(dt))                       (with dt_proj.bias)
    A        = -exp(A_log)
    abar     = 2 exp(delta A) - 1   if allow_neg_eigval    eigenvalues in [-1, 1]
               exp(delta A)         otherwise              eigenvalues in [0, 1] (stock Mamba)
    h_t      = abar * h_{t-1} + delta B_t x_t;   y_t = C_t . h_t + D x_t
    out      = out_proj(y * SiLU(z))
RMSNorm, the SSM parameters, the scan and the logits are float32 at least (float64 in a float64
model), whatever the model's dtype.

Plain PyTorch, a token-by-token scan (no fused kernels): meant for loading, checking and
fine-tuning small state-tracking models, not for speed. Generation recomputes the whole prefix at
every step (no recurrent cache). `labels` follow the transformers convention for causal LMs: the
loss compares logits[:, :-1] with labels[:, 1:], ignoring -100 (lrnn's tasks score a label at
each position instead: compute that loss from `logits`). `attention_mask` is accepted and
ignored: pad on the right.

Self-contained on purpose: imports only torch and transformers' stable public classes, so it runs
with transformers 4.40 and later (5.x included).
"""
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


def _wide(t):
    """t in float32, or wider where t is (float64): the precision of norms, scan and logits."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class LrnnMambaConfig(PretrainedConfig):
    """transformers' MambaConfig keys plus `allow_neg_eigval` (True: abar = 2 exp(delta A) - 1)."""

    model_type = "lrnn_mamba"

    def __init__(
        self,
        vocab_size=3,
        hidden_size=128,
        state_size=16,
        num_hidden_layers=2,
        layer_norm_epsilon=1e-5,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        expand=2,
        intermediate_size=None,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        hidden_act="silu",
        initializer_range=0.1,
        residual_in_fp32=True,
        time_step_rank="auto",
        time_step_scale=1.0,
        time_step_min=0.001,
        time_step_max=0.1,
        time_step_init_scheme="random",
        time_step_floor=1e-4,
        rescale_prenorm_residual=False,
        use_cache=True,
        use_mambapy=False,
        allow_neg_eigval=True,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.state_size = state_size
        self.num_hidden_layers = num_hidden_layers
        self.layer_norm_epsilon = layer_norm_epsilon
        self.expand = expand
        self.intermediate_size = int(expand * hidden_size) if intermediate_size is None else int(intermediate_size)
        if self.intermediate_size != int(expand * hidden_size):
            raise ValueError(f"intermediate_size ({intermediate_size}) must be expand * hidden_size "
                             f"({expand} * {hidden_size})")
        self.conv_kernel = conv_kernel
        self.use_bias = use_bias
        self.use_conv_bias = use_conv_bias
        if hidden_act != "silu":
            raise ValueError(f"hidden_act: only 'silu' is implemented, got {hidden_act!r}")
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.residual_in_fp32 = residual_in_fp32
        self.time_step_rank = math.ceil(hidden_size / 16) if time_step_rank == "auto" else int(time_step_rank)
        self.time_step_scale = time_step_scale
        self.time_step_min = time_step_min
        self.time_step_max = time_step_max
        self.time_step_init_scheme = time_step_init_scheme
        self.time_step_floor = time_step_floor
        self.rescale_prenorm_residual = rescale_prenorm_residual
        self.use_cache = use_cache
        self.use_mambapy = use_mambapy
        self.allow_neg_eigval = bool(allow_neg_eigval)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


class LrnnMambaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = _wide(x)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (_wide(self.weight) * x).to(dtype)


class LrnnMambaMixer(nn.Module):
    def __init__(self, config: LrnnMambaConfig, layer_idx: int):
        super().__init__()
        d, di, n, r, k = (config.hidden_size, config.intermediate_size, config.state_size, config.time_step_rank,
                          config.conv_kernel)
        self.layer_idx = layer_idx
        self.intermediate_size, self.ssm_state_size, self.time_step_rank, self.conv_kernel_size = di, n, r, k
        self.allow_neg_eigval = config.allow_neg_eigval
        self.in_proj = nn.Linear(d, 2 * di, bias=config.use_bias)
        self.conv1d = nn.Conv1d(di, di, kernel_size=k, groups=di, padding=k - 1, bias=config.use_conv_bias)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).expand(di, n).contiguous())
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, d, bias=config.use_bias)

    def scan(self, x, delta, A, Bm, Cm):
        """x, delta [B,T,Di]; A [Di,N]; Bm, Cm [B,T,N] (float32 or float64) -> C_t . h_t [B,T,Di]."""
        dA = torch.exp(delta.unsqueeze(-1) * A)                       # [B,T,Di,N]
        abar = 2 * dA - 1 if self.allow_neg_eigval else dA
        bx = (delta * x).unsqueeze(-1) * Bm.unsqueeze(2)              # [B,T,Di,N]
        h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])
        ys = []
        for t in range(x.shape[1]):
            h = abar[:, t] * h + bx[:, t]
            ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, t]))
        return torch.stack(ys, dim=1)

    def forward(self, u):                                             # u [B,T,d]
        T = u.shape[1]
        di, n, r = self.intermediate_size, self.ssm_state_size, self.time_step_rank
        xz = self.in_proj(u)
        x, z = xz[..., :di], xz[..., di:]
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :T].transpose(1, 2))   # causal: drop the tail
        dt, Bm, Cm = torch.split(self.x_proj(x), [r, n, n], dim=-1)
        delta = F.softplus(_wide(self.dt_proj(dt)))
        A = -torch.exp(_wide(self.A_log))
        xf = _wide(x)
        y = self.scan(xf, delta, A, _wide(Bm), _wide(Cm)) + xf * _wide(self.D)
        y = y * F.silu(_wide(z))
        return self.out_proj(y.to(u.dtype))


class LrnnMambaBlock(nn.Module):
    def __init__(self, config: LrnnMambaConfig, layer_idx: int):
        super().__init__()
        self.residual_in_fp32 = config.residual_in_fp32
        self.norm = LrnnMambaRMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mixer = LrnnMambaMixer(config, layer_idx)

    def forward(self, h):
        residual = _wide(h) if self.residual_in_fp32 else h
        out = residual + self.mixer(self.norm(h))
        return out.to(h.dtype)


class LrnnMambaPreTrainedModel(PreTrainedModel):
    config_class = LrnnMambaConfig
    base_model_prefix = "backbone"
    _no_split_modules = ["LrnnMambaBlock"]
    supports_gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module):
        """lrnn's initialisation (HF Mamba's: S4D-real A, D = 1, delta in [time_step_min, max]).
        Only reached for parameters a checkpoint does not provide (from_config, or missing keys)."""
        cfg = self.config
        std = cfg.initializer_range
        if isinstance(module, LrnnMambaMixer):
            n = module.ssm_state_size
            module.A_log.copy_(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).expand_as(module.A_log))
            module.D.fill_(1.0)
            dt_std = module.time_step_rank ** -0.5 * cfg.time_step_scale
            if cfg.time_step_init_scheme == "constant":
                module.dt_proj.weight.fill_(dt_std)
            else:
                module.dt_proj.weight.uniform_(-dt_std, dt_std)
            lo, hi = math.log(cfg.time_step_min), math.log(cfg.time_step_max)
            dt = torch.exp(torch.rand(module.intermediate_size) * (hi - lo) + lo).clamp(min=cfg.time_step_floor)
            module.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))   # softplus^-1
            nn.init.normal_(module.in_proj.weight, std=std)
            nn.init.normal_(module.x_proj.weight, std=std)
            k = module.conv_kernel_size
            nn.init.uniform_(module.conv1d.weight, -1 / math.sqrt(k), 1 / math.sqrt(k))
            bound = 1 / math.sqrt(module.intermediate_size)
            if cfg.rescale_prenorm_residual:
                bound /= math.sqrt(cfg.num_hidden_layers)
            nn.init.uniform_(module.out_proj.weight, -bound, bound)
            for b in (module.in_proj.bias, module.conv1d.bias, module.out_proj.bias):
                if b is not None:
                    b.zero_()
        elif isinstance(module, LrnnMambaRMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, LrnnMambaForCausalLM):
            nn.init.normal_(module.lm_head.weight, std=std)


class LrnnMambaModel(LrnnMambaPreTrainedModel):
    def __init__(self, config: LrnnMambaConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LrnnMambaBlock(config, i) for i in range(config.num_hidden_layers)])
        self.norm_f = LrnnMambaRMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        h = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        for layer in self.layers:
            h = layer(h)
        return self.norm_f(h)


class LrnnMambaForCausalLM(LrnnMambaPreTrainedModel, GenerationMixin):
    _tied_weights_keys = ["lm_head.weight"]  # tied when config.tie_word_embeddings (post_init ties them)

    def __init__(self, config: LrnnMambaConfig):
        super().__init__(config)
        self.backbone = LrnnMambaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def prepare_inputs_for_generation(self, input_ids, inputs_embeds=None, **kwargs):
        # No recurrent cache: every step runs the whole prefix.
        return {"input_ids": input_ids}

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        labels: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[Tuple, CausalLMOutput]:
        h = self.backbone(input_ids=input_ids, inputs_embeds=inputs_embeds)
        logits = _wide(self.lm_head(h.to(self.lm_head.weight.dtype)))
        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return CausalLMOutput(loss=loss, logits=logits)
