"""monarch_fftconv: fast causal long convolutions (Hyena, H3, S4, Monarch Mixer) for PyTorch.

Public API:
- `fftconv(u, k, *, D=None, pregate=None, postgate=None, bidirectional=False, precision=None)`:
  the differentiable convolution, y = postgate ⊙ (conv(pregate ⊙ u, k) + D ⊙ (pregate ⊙ u)),
  with one filter per channel or per group of channels, causal or bidirectional;
- `FFTConv(channels, seq_len, *, groups=None, bidirectional=False, precision=None)`: the nn.Module;
  `monarch_fftconv.nn.HyenaOperator(d_model, l_max, order=2, ...)`: the Hyena operator on
  `fftconv`, with safari's parameter names;
- `FFTConv.prefill/step`, `HyenaOperator.prefill/step` (`monarch_fftconv.generation`): exact
  token-by-token generation in amortised O(log² L) work per token;
- `inference_cache(model)`: context manager; the `FFTConv` layers of `model` compute each
  filter spectrum once for the block (serving), from their filters as they are on entry;
- `precision(name)`: context manager overriding the precision of calls inside it;
- `explain(u, k, *, D=None, pregate=None, postgate=None, bidirectional=False, precision=None)`:
  which backend a call would take, and why;
- `PRECISIONS`: the precision names.

Importing this package registers the `monarch_fftconv::*` torch ops and nothing else:
no CUDA initialisation, no build, no RNG or global-flag changes.
"""

from .functional import explain, fftconv
from .nn import FFTConv, inference_cache
from .policy import PRECISIONS, precision

__all__ = ["FFTConv", "PRECISIONS", "explain", "fftconv", "inference_cache", "precision"]
__version__ = "0.1.0"
